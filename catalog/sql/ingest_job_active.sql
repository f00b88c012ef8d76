SELECT job_id, status FROM ingest_jobs
WHERE model = :model AND status IN ('queued', 'running')
ORDER BY created_at DESC LIMIT 1
