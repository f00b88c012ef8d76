-- planner_fill_pass_group.sql when no candidate carries lora_A bytes (every unit costs its
-- bytes): among the groups not selected yet whose bytes alone fit the leftover :remaining, take
-- the longest prefix in group order whose running bytes fit, whole groups only. Returns the
-- bytes charged to each unit taken.
UPDATE planner_candidates AS c
SET pass = :pass, charged = p.nbytes
FROM (
    SELECT unit_rank, nbytes,
           SUM(nbytes) OVER (ORDER BY group_rank
                             RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
    FROM (
        SELECT unit_rank, group_rank, nbytes,
               SUM(nbytes) OVER (PARTITION BY group_rank) AS alone
        FROM planner_candidates
        WHERE cumulative > CAST(:budget AS BIGINT) AND pass IS NULL
    ) AS g
    WHERE alone <= CAST(:remaining AS BIGINT)
) AS p
WHERE c.unit_rank = p.unit_rank AND p.running <= CAST(:remaining AS BIGINT)
RETURNING charged
