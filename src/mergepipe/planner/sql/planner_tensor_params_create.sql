-- Per-(expert, tensor) values of a request with per-tensor parameters (a mergekit config's
-- gradients and filter: values), overriding planner_request's per-expert ones; empty otherwise.
-- Every parameter is a list, one entry per row:
--   position     the expert's position in the request
--   rank_weight  |alpha_i| at this tensor
--   trim_j       ties: the trim-grid index of the density at this tensor
CREATE OR REPLACE TEMP TABLE planner_tensor_params AS
SELECT unnest(CAST(:position AS INTEGER[])) AS position,
       unnest(CAST(:tensor AS VARCHAR[])) AS tensor,
       unnest(CAST(:rank_weight AS DOUBLE[])) AS rank_weight,
       unnest(CAST(:trim_j AS INTEGER[])) AS trim_j
