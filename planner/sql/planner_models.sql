-- The catalog rows of the models named in a merge request.
SELECT name, kind, base, status, error, has_stats, lora_scale
FROM models
WHERE name IN (SELECT UNNEST(CAST(:names AS VARCHAR[])))
