-- Units added by fill pass :pass, and the bytes planned so far (prefix + fill passes).
SELECT COUNT(*) FILTER (WHERE pass = :pass) AS added,
       COALESCE(SUM(CASE WHEN cumulative <= CAST(:budget AS BIGINT) THEN cost ELSE charged END),
                0) AS spent
FROM planner_candidates
