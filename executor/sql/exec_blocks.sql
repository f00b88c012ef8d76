SELECT tensor, block_index, row_start, row_end, file_index, byte_offset, nbytes, content_hash
FROM blocks
WHERE model = :model
ORDER BY tensor, block_index
