SELECT name, kind, path, base, status, has_stats, block_bytes, lora_scale
FROM models
WHERE name = :name
