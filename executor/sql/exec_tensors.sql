SELECT tensor, ordinal, file_index, dtype, shape, data_offset, nbytes,
       lora_a_file_index, lora_a_offset, lora_a_nbytes, lora_a_dtype, lora_a_shape, lora_scale,
       lora_a_hash
FROM tensors
WHERE model = :model
ORDER BY ordinal
