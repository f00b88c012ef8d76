-- planner_fill_pass.sql when no candidate carries lora_A bytes (every unit costs its bytes):
-- among the units not selected yet that fit the leftover :remaining alone, take the longest
-- prefix in rank order whose running bytes fit. Returns the bytes charged to each unit taken.
UPDATE planner_candidates AS c
SET pass = :pass, charged = p.nbytes
FROM (
    SELECT unit_rank, nbytes,
           SUM(nbytes) OVER (ORDER BY unit_rank ROWS UNBOUNDED PRECEDING) AS running
    FROM planner_candidates
    WHERE cumulative > CAST(:budget AS BIGINT) AND pass IS NULL
      AND nbytes <= CAST(:remaining AS BIGINT)
) AS p
WHERE c.unit_rank = p.unit_rank AND p.running <= CAST(:remaining AS BIGINT)
RETURNING charged
