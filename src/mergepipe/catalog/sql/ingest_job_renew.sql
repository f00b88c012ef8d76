-- The heartbeat of the worker holding an ingestion (no row: the lease was lost).
UPDATE ingest_jobs SET lease_until = :until
WHERE job_id = :job_id AND worker = :worker AND status IN ('queued', 'running')
