-- A candidate of an expert that claims statistics but lacks some (planning it would silently
-- drop blocks): the expert, the tensor and what is missing.
SELECT r.model, t.tensor, c.missing
FROM planner_candidates c
JOIN planner_request r ON r.position = c.position
JOIN tensors t ON t.model = r.model AND t.ordinal = c.ordinal
WHERE c.missing IS NOT NULL
ORDER BY c.position, c.ordinal
LIMIT 1
