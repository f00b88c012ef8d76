SELECT * FROM ingest_jobs WHERE job_id = :job_id
