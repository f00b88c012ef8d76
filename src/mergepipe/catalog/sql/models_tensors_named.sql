-- The tensors of models, each model's in checkpoint order (the columns by position, as
-- models_tensors.sql: catalog.models._tensor): every tensor of the models in :whole, and of
-- those in :models the tensors whose names are in :tensors (those a plan reads).
SELECT model, tensor, ordinal, file_index, dtype, shape, data_offset, nbytes,
       lora_a_file_index, lora_a_offset, lora_a_nbytes, lora_a_dtype, lora_a_shape, lora_a_hash,
       lora_scale, value_l2
FROM tensors
WHERE list_contains(CAST(:whole AS VARCHAR[]), model)
   OR (list_contains(CAST(:models AS VARCHAR[]), model)
       AND list_contains(CAST(:tensors AS VARCHAR[]), tensor))
ORDER BY model, ordinal
