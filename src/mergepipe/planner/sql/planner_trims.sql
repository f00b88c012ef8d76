-- TIES trim thresholds at each expert's requested density, per expert tensor (the density at
-- that tensor when the request gives per-tensor values: planner_tensor_params).
SELECT ts.model, ts.tensor, ts.numel, COALESCE(tp.trim_j, r.trim_j) AS trim_j,
       ts.trim_tau[COALESCE(tp.trim_j, r.trim_j)] AS tau,
       ts.trim_above[COALESCE(tp.trim_j, r.trim_j)] AS above,
       ts.trim_tied[COALESCE(tp.trim_j, r.trim_j)] AS tied
FROM planner_request r
JOIN tensor_stats ts ON ts.model = r.model
LEFT JOIN planner_tensor_params tp ON tp.position = r.position AND tp.tensor = ts.tensor
WHERE r.trim_j IS NOT NULL AND r.has_stats AND len(ts.trim_tau) >= COALESCE(tp.trim_j, r.trim_j)
ORDER BY r.position, ts.tensor
