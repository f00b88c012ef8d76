-- The smallest budget that reads at least one expert byte: the cheapest candidate unit alone,
-- its bytes plus lora_A (charged to the first unit of an untouched tensor). A budget below it
-- plans nothing; at it, the fill pass takes that unit (planner_fill_pass.sql). NULL: no unit.
SELECT MIN(nbytes + lora_a_nbytes) FROM planner_candidates
