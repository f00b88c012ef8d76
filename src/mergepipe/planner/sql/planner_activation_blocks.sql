-- The request's expert blocks with a nonzero delta (calibrated utilities): l2 and the
-- channel-group column norms (NULL: a tensor that is not 2-D, or ingested before them).
SELECT r.position, s.tensor, s.block_index, s.l2, s.col_sq
FROM planner_request r
JOIN block_stats s ON s.model = r.model
WHERE r.has_stats AND s.l2 > 0
ORDER BY r.position, s.tensor, s.block_index
