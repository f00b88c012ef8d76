-- The tensors of the models named in a list, each model's in checkpoint order (the columns by
-- position: catalog.models._tensor).
SELECT model, tensor, ordinal, file_index, dtype, shape, data_offset, nbytes,
       lora_a_file_index, lora_a_offset, lora_a_nbytes, lora_a_dtype, lora_a_shape, lora_a_hash,
       lora_scale, value_l2
FROM tensors WHERE list_contains(CAST(:models AS VARCHAR[]), model)
ORDER BY model, ordinal
