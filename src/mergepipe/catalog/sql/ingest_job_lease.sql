-- Take (or renew) the lease of an ingestion; a job taken over goes back to queued.
UPDATE ingest_jobs
SET worker = :worker, lease_until = :until, attempts = COALESCE(attempts, 0) + 1,
    status = 'queued', started_at = NULL
WHERE job_id = :job_id
