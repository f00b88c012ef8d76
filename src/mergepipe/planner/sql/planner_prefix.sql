-- The knapsack prefix under :budget (`cumulative <= :budget`; cost >= 0 makes it a prefix of
-- the rank order): its bytes, and the fewest bytes of a unit left out (NULL: none is), which a
-- fill pass can only take when it is at most the leftover budget.
SELECT COALESCE(SUM(cost) FILTER (WHERE cumulative <= CAST(:budget AS BIGINT)), 0) AS spent,
       MIN(nbytes) FILTER (WHERE cumulative > CAST(:budget AS BIGINT)) AS smallest_left
FROM planner_candidates
