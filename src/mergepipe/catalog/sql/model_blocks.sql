-- The blocks of a model, tensor by tensor in checkpoint order.
SELECT b.tensor, b.block_index, b.row_start, b.row_end, b.file_index, b.byte_offset, b.nbytes,
       b.content_hash
FROM blocks b JOIN tensors t ON t.model = b.model AND t.tensor = b.tensor
WHERE b.model = :model ORDER BY t.ordinal, b.block_index
