-- The claims of jobs that ended (after a recovery marked running jobs failed).
DELETE FROM name_claims
WHERE job_id IN (SELECT job_id FROM ingest_jobs WHERE status IN ('succeeded', 'failed'))
   OR job_id IN (SELECT merge_id FROM merges WHERE status IN ('succeeded', 'failed'))
