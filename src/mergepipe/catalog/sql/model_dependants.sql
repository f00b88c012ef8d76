-- What depends on some model versions (the keys) of a name (refs: the keys and the name):
-- live merge outputs made from them, live experts of them, and unfinished ingestions onto them.
SELECT 'merge output' AS kind, l.child AS name, l.merge_id AS merge_id
FROM lineage l JOIN models m ON m.name = l.child
WHERE l.parent IN (SELECT UNNEST(CAST(:keys AS VARCHAR[]))) AND m.retired_at IS NULL
  AND l.child NOT IN (SELECT UNNEST(CAST(:keys AS VARCHAR[])))
UNION
SELECT 'expert' AS kind, name, NULL AS merge_id FROM models
WHERE base IN (SELECT UNNEST(CAST(:keys AS VARCHAR[]))) AND retired_at IS NULL
UNION
SELECT 'ingestion' AS kind, model AS name, job_id AS merge_id FROM ingest_jobs
WHERE status IN ('queued', 'running') AND base IN (SELECT UNNEST(CAST(:refs AS VARCHAR[])))
ORDER BY kind, name
