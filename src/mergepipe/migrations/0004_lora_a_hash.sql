-- 0004: content hash of a LoRA tensor's lora_A bytes (xxh3-128 of the raw bytes, as
-- blocks.content_hash), checked by the executor when it reads lora_A. NULL for non-LoRA tensors
-- and for adapters ingested before this migration (re-ingest them to get the check).

ALTER TABLE tensors ADD COLUMN lora_a_hash VARCHAR;
