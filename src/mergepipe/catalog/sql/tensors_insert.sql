-- All tensors of one model at once; every parameter except the model is a list, one entry per row.
INSERT INTO tensors (model, tensor, ordinal, file_index, dtype, shape, data_offset, nbytes,
                     n_blocks, lora_a_file_index, lora_a_offset, lora_a_nbytes, lora_a_dtype,
                     lora_a_shape, lora_scale, lora_a_hash, value_l2)
SELECT :model, unnest(:tensor), unnest(:ordinal), unnest(:file_index), unnest(:dtype),
       unnest(:shape), unnest(:data_offset), unnest(:nbytes), unnest(:n_blocks),
       unnest(:lora_a_file_index), unnest(:lora_a_offset), unnest(:lora_a_nbytes),
       unnest(:lora_a_dtype), unnest(:lora_a_shape), unnest(:lora_scale),
       unnest(:lora_a_hash), unnest(:value_l2)
