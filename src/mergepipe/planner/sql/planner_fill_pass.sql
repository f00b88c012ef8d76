-- One pass filling the leftover budget :remaining after the knapsack prefix (cumulative <=
-- :budget) and the earlier passes. Among the units not selected yet that would fit alone (their
-- bytes, plus lora_A when their tensor is not touched yet), take the longest prefix in rank
-- order whose running cost fits; lora_A is charged to the first unit of each untouched tensor.
-- Repeating passes until one adds nothing is exactly the sequential greedy in rank order: a unit
-- that does not fit at the start of a pass never fits later (the remainder only shrinks, and a
-- lora_A charged earlier in the same pass costs more than it saves). Returns the bytes charged
-- to each unit it selected (none: the pass added nothing).
UPDATE planner_candidates AS c
SET pass = :pass, charged = p.cost
FROM (
    SELECT unit_rank, cost,
           SUM(cost) OVER (ORDER BY unit_rank ROWS UNBOUNDED PRECEDING) AS running
    FROM (
        SELECT f.unit_rank,
               f.nbytes + CASE
                   WHEN f.touched THEN 0
                   WHEN ROW_NUMBER() OVER (PARTITION BY f.position, f.ordinal
                                           ORDER BY f.unit_rank) = 1 THEN f.lora_a_nbytes
                   ELSE 0 END AS cost
        FROM (
            SELECT u.unit_rank, u.position, u.ordinal, u.nbytes, u.lora_a_nbytes,
                   u.lora_a_nbytes = 0 OR EXISTS (
                       SELECT 1 FROM planner_candidates s
                       WHERE s.position = u.position AND s.ordinal = u.ordinal
                         AND (s.cumulative <= CAST(:budget AS BIGINT) OR s.pass IS NOT NULL)
                   ) AS touched
            FROM planner_candidates u
            WHERE u.cumulative > CAST(:budget AS BIGINT) AND u.pass IS NULL
              AND u.nbytes <= CAST(:remaining AS BIGINT)
        ) AS f
        WHERE f.nbytes + CASE WHEN f.touched THEN 0 ELSE f.lora_a_nbytes END
              <= CAST(:remaining AS BIGINT)
    ) AS fitting
) AS p
WHERE c.unit_rank = p.unit_rank AND p.running <= CAST(:remaining AS BIGINT)
RETURNING charged
