-- The access set in rank order (rank is given by the row order), as PlannedBlock fields plus
-- each block's content hash (for the access digest) and its other catalog fields (the
-- executor's BlockRow, reused by executor.prepare): selected block units, and every block of
-- each selected fallback tensor, with the blocks' rows joined back.
WITH selected AS (
    SELECT c.unit_rank, r.model, c.tensor, c.block_index, c.nbytes, c.utility, c.fallback
    FROM planner_candidates c
    JOIN planner_request r ON r.position = c.position
    WHERE c.cumulative <= CAST(:budget AS BIGINT) OR c.pass IS NOT NULL
)
SELECT model, tensor, block_index, nbytes, utility, content_hash, row_start, row_end,
       file_index, byte_offset
FROM (
    SELECT s.unit_rank, s.model, s.tensor, s.block_index, s.nbytes, s.utility, b.content_hash,
           b.row_start, b.row_end, b.file_index, b.byte_offset
    FROM selected s
    JOIN blocks b ON b.model = s.model AND b.tensor = s.tensor AND b.block_index = s.block_index
    WHERE NOT s.fallback
    UNION ALL
    SELECT s.unit_rank, s.model, s.tensor, b.block_index, b.nbytes, CAST(0 AS DOUBLE),
           b.content_hash, b.row_start, b.row_end, b.file_index, b.byte_offset
    FROM selected s
    JOIN blocks b ON b.model = s.model AND b.tensor = s.tensor
    WHERE s.fallback
) AS a
ORDER BY unit_rank, block_index
