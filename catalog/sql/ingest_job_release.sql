-- Give a queued ingestion back (its worker stops, or cannot run it yet).
UPDATE ingest_jobs SET worker = NULL, lease_until = NULL
WHERE job_id = :job_id AND worker = :worker AND status = 'queued'
