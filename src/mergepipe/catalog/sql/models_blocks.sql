-- The blocks of the models named in a list, each model's tensor by tensor in checkpoint order.
SELECT b.model, b.tensor, b.block_index, b.row_start, b.row_end, b.file_index, b.byte_offset,
       b.nbytes, b.content_hash
FROM blocks b JOIN tensors t ON t.model = b.model AND t.tensor = b.tensor
WHERE list_contains(CAST(:models AS VARCHAR[]), b.model)
ORDER BY b.model, t.ordinal, b.block_index
