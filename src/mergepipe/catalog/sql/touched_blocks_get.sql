SELECT model, tensor, block_index, nbytes, utility, rank
FROM touched_blocks
WHERE merge_id = :merge_id
ORDER BY rank, model, tensor, block_index
