-- Jobs to resume at start-up, oldest first: ingestions and merges in one queue.
SELECT 'ingest' AS kind, job_id AS id, created_at FROM ingest_jobs WHERE status = 'queued'
UNION ALL
SELECT 'merge' AS kind, merge_id AS id, created_at FROM merges WHERE status = 'queued'
ORDER BY created_at, id
