INSERT INTO ingest_jobs (job_id, model, kind, path, base, block_bytes, with_stats, status)
VALUES (:job_id, :model, :kind, :path, :base, :block_bytes, :with_stats, 'queued')
