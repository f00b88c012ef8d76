SELECT * FROM ingest_jobs WHERE model = :model ORDER BY created_at DESC, job_id DESC LIMIT 1
