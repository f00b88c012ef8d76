UPDATE ingest_jobs
SET status = :status, error = :error, done_bytes = :done_bytes, total_bytes = :total_bytes,
    finished_at = current_timestamp
WHERE job_id = :job_id
