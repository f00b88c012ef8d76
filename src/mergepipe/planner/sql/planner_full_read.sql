-- C_full of the request's operator: every candidate's bytes, lora_A once per candidate tensor.
SELECT COALESCE(SUM(cost), 0) FROM planner_candidates
