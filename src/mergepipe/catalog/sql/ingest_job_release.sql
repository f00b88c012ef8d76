-- Give a queued ingestion back (its worker stops, or cannot run it yet).
-- :not_before: no worker claims it again before then (NULL: at once).
UPDATE ingest_jobs SET worker = NULL, lease_until = :not_before
WHERE job_id = :job_id AND worker = :worker AND status = 'queued'
