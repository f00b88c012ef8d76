-- The oldest ingestion a worker may take: queued and neither held nor put back for later, or
-- running under an expired lease (its worker died). Rows other workers are claiming right now
-- are skipped (PostgreSQL).
SELECT job_id, status FROM ingest_jobs
WHERE (status = 'queued' AND (lease_until IS NULL OR lease_until < :now))
   OR (status = 'running' AND lease_until < :now)
ORDER BY created_at, job_id
LIMIT 1
FOR UPDATE SKIP LOCKED
