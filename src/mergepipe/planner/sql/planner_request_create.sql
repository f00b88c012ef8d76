-- The request's experts, as rows the planner's queries join against (one per connection),
-- made in one statement: every parameter but :per_tensor and :activation is a list, one entry
-- per expert.
--   position     position of the expert in the request (tie-break)
--   rank_weight  |alpha_i|: utility of a block = rank_weight * l2
--   trim_j       ties: 1-based index into tensor_stats.trim_* (= density*100); NULL otherwise
--   has_stats    false: planned whole tensors (fallback)
--   per_tensor   rank by utility / ||D_it||_2 (params.utility = per_tensor)
--   activation   rank by planner_activation.act, the calibrated output change
--                (params.utility = activation, fisher)
CREATE OR REPLACE TEMP TABLE planner_request AS
SELECT unnest(CAST(:position AS INTEGER[])) AS position,
       unnest(CAST(:model AS VARCHAR[])) AS model,
       unnest(CAST(:rank_weight AS DOUBLE[])) AS rank_weight,
       unnest(CAST(:trim_j AS INTEGER[])) AS trim_j,
       unnest(CAST(:has_stats AS BOOLEAN[])) AS has_stats,
       CAST(:per_tensor AS BOOLEAN) AS per_tensor,
       CAST(:activation AS BOOLEAN) AS activation
