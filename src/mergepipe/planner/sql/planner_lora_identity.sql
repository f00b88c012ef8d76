-- What identifies a LoRA expert's delta beyond its lora_B block hashes: per adapted tensor, the
-- scale, lora_A layout, the delta's statistics (which change when lora_A does) and lora_A's
-- content hash (NULL for adapters ingested before migration 0004).
SELECT r.position, t.tensor, t.lora_scale, t.lora_a_dtype, t.lora_a_shape, t.lora_a_nbytes,
       ts.l2, ts.l1, ts.max_abs, t.lora_a_hash
FROM planner_request r
JOIN tensors t ON t.model = r.model
LEFT JOIN tensor_stats ts ON ts.model = t.model AND ts.tensor = t.tensor
WHERE t.lora_a_nbytes IS NOT NULL
ORDER BY r.position, t.ordinal
