-- C_full of the request's operator: every candidate's bytes, lora_A once per candidate tensor;
-- and how many candidates miss statistics (planner_missing_stats.sql names the first).
SELECT COALESCE(SUM(cost), 0) AS full_read, COUNT(missing) AS missing
FROM planner_candidates
