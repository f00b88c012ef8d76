-- A candidate of an expert that claims statistics but lacks some (planning it would silently
-- drop blocks): the expert, the tensor and what is missing.
SELECT r.model, c.tensor, c.missing
FROM planner_candidates c
JOIN planner_request r ON r.position = c.position
WHERE c.missing IS NOT NULL
ORDER BY c.position, c.ordinal
LIMIT 1
