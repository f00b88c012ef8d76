-- After a fill pass: the fewest bytes of a unit still left out (NULL: none is), so that no
-- pass runs when nothing left could fit the leftover (a pass costs a window over the units).
SELECT MIN(nbytes) AS smallest_left
FROM planner_candidates
WHERE cumulative > CAST(:budget AS BIGINT) AND pass IS NULL
