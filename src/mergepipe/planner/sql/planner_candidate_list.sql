-- The candidate units of the request loaded in this connection, with names, in rank order
-- (for tools that compare the planner's choice with other access sets, e.g. benchmarks).
SELECT r.model, c.tensor, c.block_index, c.nbytes, c.lora_a_nbytes, c.utility, c.fallback,
       c.unit_rank
FROM planner_candidates c
JOIN planner_request r ON r.position = c.position
ORDER BY c.unit_rank
