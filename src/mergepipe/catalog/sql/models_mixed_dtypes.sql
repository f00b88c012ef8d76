-- The tensors whose dtype differs between the models named in a list (a base and its full
-- experts: the dtypes a merge promotes, executor.blocks.ChunkMerger.input_dtype).
SELECT tensor FROM tensors
WHERE list_contains(CAST(:models AS VARCHAR[]), model)
GROUP BY tensor
HAVING MIN(dtype) <> MAX(dtype)
