-- The queued or running ingestion of a model, if any.
SELECT * FROM ingest_jobs
WHERE model = :model AND status IN ('queued', 'running')
ORDER BY created_at DESC LIMIT 1
