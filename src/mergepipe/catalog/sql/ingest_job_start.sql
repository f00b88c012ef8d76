UPDATE ingest_jobs SET status = 'running', started_at = current_timestamp
WHERE job_id = :job_id AND status = 'queued'
