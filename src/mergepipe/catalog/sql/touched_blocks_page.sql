-- One page of a merge's access set in planner order; `after_rank` is the cursor (-1: start).
SELECT model, tensor, block_index, nbytes, utility, rank
FROM touched_blocks
WHERE merge_id = :merge_id AND rank > :after_rank
ORDER BY rank, model, tensor, block_index
LIMIT :limit OFFSET :offset
