SELECT job_id FROM ingest_jobs WHERE model = :model AND status IN ('queued', 'running') LIMIT 1
