-- Per expert position: candidate and selected blocks, full-read cost, planned bytes, and the
-- utility of the omitted candidates (the terms of the omitted-update bound).
SELECT position,
       SUM(n_blocks) AS candidate_blocks,
       COALESCE(SUM(n_blocks) FILTER (WHERE selected), 0) AS selected_blocks,
       SUM(cost) AS full_read_bytes,
       SUM(CASE WHEN cumulative <= CAST(:budget AS BIGINT) THEN cost ELSE charged END)
           AS planned_bytes,
       COALESCE(SUM(utility) FILTER (WHERE NOT selected), 0) AS omitted_utility
FROM (
    SELECT *, cumulative <= CAST(:budget AS BIGINT) OR pass IS NOT NULL AS selected
    FROM planner_candidates
) AS c
GROUP BY position
ORDER BY position
