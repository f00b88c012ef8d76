-- TIES trim thresholds at each expert's requested density, per expert tensor.
SELECT ts.model, ts.tensor, ts.numel, r.trim_j,
       ts.trim_tau[r.trim_j] AS tau, ts.trim_above[r.trim_j] AS above,
       ts.trim_tied[r.trim_j] AS tied
FROM planner_request r
JOIN tensor_stats ts ON ts.model = r.model
WHERE r.trim_j IS NOT NULL AND r.has_stats AND len(ts.trim_tau) >= r.trim_j
ORDER BY r.position, ts.tensor
