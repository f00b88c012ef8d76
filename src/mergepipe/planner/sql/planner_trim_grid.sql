-- The whole 1% trim-threshold grid of every expert tensor with statistics (band operators).
SELECT r.position, ts.model, ts.tensor, ts.numel, ts.trim_tau, ts.trim_above, ts.trim_tied
FROM planner_request r
JOIN tensor_stats ts ON ts.model = r.model
WHERE r.has_stats
ORDER BY r.position, ts.tensor
