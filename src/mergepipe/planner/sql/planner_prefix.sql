-- The knapsack prefix under :budget (`cumulative <= :budget`; cost >= 0 makes it a prefix of
-- the rank order): its bytes; the fewest bytes of a unit left out (NULL: none is), which a fill
-- pass can only take when it is at most the leftover budget; and whether any candidate carries
-- lora_A bytes (without, the fill passes need not track touched tensors).
SELECT COALESCE(SUM(cost) FILTER (WHERE cumulative <= CAST(:budget AS BIGINT)), 0) AS spent,
       MIN(nbytes) FILTER (WHERE cumulative > CAST(:budget AS BIGINT)) AS smallest_left,
       COALESCE(MAX(lora_a_nbytes), 0) > 0 AS lora
FROM planner_candidates
