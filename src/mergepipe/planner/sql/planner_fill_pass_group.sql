-- One fill pass over the leftover budget :remaining for coherent groups (the group form of
-- planner_fill_pass.sql): among the groups not selected yet whose cost alone fits (their units'
-- bytes, plus lora_A once per (expert, tensor) not touched yet), take the longest prefix in
-- group order whose running cost fits, whole groups only; lora_A is charged to the first unit
-- of each untouched (expert, tensor) among the fitting groups, so a prefix never misses one.
-- Returns the bytes charged to each unit it selected (none: the pass added nothing).
-- Groups are never split: a group is selected (prefix or pass) with all its units.
UPDATE planner_candidates AS c
SET pass = :pass, charged = p.cost
FROM (
    SELECT unit_rank, cost,
           SUM(cost) OVER (ORDER BY group_rank
                           RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
    FROM (
        SELECT g.unit_rank, g.group_rank,
               g.nbytes + CASE
                   WHEN g.touched THEN 0
                   WHEN ROW_NUMBER() OVER (PARTITION BY g.position, g.ordinal
                                           ORDER BY g.unit_rank) = 1 THEN g.lora_a_nbytes
                   ELSE 0 END AS cost
        FROM (
            SELECT f.*,
                   SUM(f.nbytes + CASE WHEN f.touched OR NOT f.first_in_group THEN 0
                                       ELSE f.lora_a_nbytes END)
                       OVER (PARTITION BY f.group_rank) AS alone
            FROM (
                SELECT u.unit_rank, u.group_rank, u.position, u.ordinal, u.nbytes,
                       u.lora_a_nbytes,
                       ROW_NUMBER() OVER (PARTITION BY u.group_rank, u.position, u.ordinal
                                          ORDER BY u.unit_rank) = 1 AS first_in_group,
                       u.lora_a_nbytes = 0 OR EXISTS (
                           SELECT 1 FROM planner_candidates s
                           WHERE s.position = u.position AND s.ordinal = u.ordinal
                             AND (s.cumulative <= CAST(:budget AS BIGINT)
                                  OR s.pass IS NOT NULL)
                       ) AS touched
                FROM planner_candidates u
                WHERE u.cumulative > CAST(:budget AS BIGINT) AND u.pass IS NULL
            ) AS f
        ) AS g
        WHERE g.alone <= CAST(:remaining AS BIGINT)
    ) AS fitting
) AS p
WHERE c.unit_rank = p.unit_rank AND p.running <= CAST(:remaining AS BIGINT)
RETURNING charged
