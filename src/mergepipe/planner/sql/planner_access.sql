-- The access set in rank order, as PlannedBlock fields (rank is given by the row order).
SELECT model, tensor, block_index, nbytes, utility
FROM planner_access
ORDER BY unit_rank, block_index
