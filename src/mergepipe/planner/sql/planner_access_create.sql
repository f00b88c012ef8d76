-- The access set: selected block units, and every block of each selected fallback tensor, with
-- names and content hashes joined back. Ordered by (unit_rank, block_index) when read.
CREATE OR REPLACE TEMP TABLE planner_access AS
WITH selected AS (
    SELECT c.*, r.model, t.tensor
    FROM planner_candidates c
    JOIN planner_request r ON r.position = c.position
    JOIN tensors t ON t.model = r.model AND t.ordinal = c.ordinal
    WHERE c.cumulative <= CAST(:budget AS BIGINT) OR c.pass IS NOT NULL
)
SELECT s.unit_rank, s.model, s.tensor, s.block_index, s.nbytes, s.utility, b.content_hash
FROM selected s
JOIN blocks b ON b.model = s.model AND b.tensor = s.tensor AND b.block_index = s.block_index
WHERE NOT s.fallback
UNION ALL
SELECT s.unit_rank, s.model, s.tensor, b.block_index, b.nbytes, CAST(0 AS DOUBLE), b.content_hash
FROM selected s
JOIN blocks b ON b.model = s.model AND b.tensor = s.tensor
WHERE s.fallback
