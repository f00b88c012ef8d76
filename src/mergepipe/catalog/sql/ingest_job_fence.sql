-- Fencing: the ingestion is still held by :worker under an unexpired lease. The row stays
-- locked until the caller's transaction ends, so that no other worker takes it over meanwhile.
SELECT job_id FROM ingest_jobs
WHERE job_id = :job_id AND worker = :worker AND lease_until > :now
  AND status IN ('queued', 'running')
FOR UPDATE
