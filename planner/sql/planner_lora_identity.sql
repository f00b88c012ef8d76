-- What identifies a LoRA expert's delta beyond its lora_B block hashes (lora_A bytes are not
-- content-hashed at ingestion): per adapted tensor, the scale, lora_A layout and the delta's
-- statistics (which change when lora_A does).
SELECT r.position, t.tensor, t.lora_scale, t.lora_a_dtype, t.lora_a_shape, t.lora_a_nbytes,
       ts.l2, ts.l1, ts.max_abs
FROM planner_request r
JOIN tensors t ON t.model = r.model
LEFT JOIN tensor_stats ts ON ts.model = t.model AND ts.tensor = t.tensor
WHERE t.lora_a_nbytes IS NOT NULL
ORDER BY r.position, t.ordinal
