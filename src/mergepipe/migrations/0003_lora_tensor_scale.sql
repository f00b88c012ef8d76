-- 0003: per-tensor LoRA scale (rank_pattern / alpha_pattern give modules their own r and alpha).

ALTER TABLE tensors ADD COLUMN lora_scale DOUBLE;
