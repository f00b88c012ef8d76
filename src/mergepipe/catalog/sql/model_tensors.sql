-- The tensors of a model in checkpoint order (the columns by position: catalog.models._tensor).
SELECT tensor, ordinal, file_index, dtype, shape, data_offset, nbytes, lora_a_file_index,
       lora_a_offset, lora_a_nbytes, lora_a_dtype, lora_a_shape, lora_a_hash, lora_scale, value_l2
FROM tensors WHERE model = :model ORDER BY ordinal
