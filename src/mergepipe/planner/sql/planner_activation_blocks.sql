-- The request's expert blocks with a nonzero delta (utility=activation*): l2, the channel-group
-- column norms (NULL: a tensor that is not 2-D, or ingested before them) and the L2 norm of the
-- base's tensor (NULL: a base ingested before migration 0009).
SELECT r.position, s.tensor, s.block_index, s.l2, s.col_sq, bt.value_l2
FROM planner_request r
JOIN block_stats s ON s.model = r.model
LEFT JOIN tensors bt ON bt.model = :base AND bt.tensor = s.tensor
WHERE r.has_stats AND s.l2 > 0
ORDER BY r.position, s.tensor, s.block_index
