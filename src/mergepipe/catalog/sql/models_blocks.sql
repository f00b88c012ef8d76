-- The blocks of the models named in a list, each model's in file order (file, then byte offset:
-- the order their bytes are read in; no join to the tensors for their checkpoint order).
SELECT b.model, b.tensor, b.block_index, b.row_start, b.row_end, b.file_index, b.byte_offset,
       b.nbytes, b.content_hash
FROM blocks b
WHERE list_contains(CAST(:models AS VARCHAR[]), b.model)
ORDER BY b.model, b.file_index, b.byte_offset
