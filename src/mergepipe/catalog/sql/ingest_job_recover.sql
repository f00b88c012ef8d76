UPDATE ingest_jobs
SET status = 'failed', finished_at = current_timestamp,
    error = 'the server stopped while this ingestion was running; submit it again'
WHERE status = 'running'
