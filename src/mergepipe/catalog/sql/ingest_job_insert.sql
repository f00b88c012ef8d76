INSERT INTO ingest_jobs (job_id, model, kind, path, base, block_bytes, with_stats, status,
                         request_id)
VALUES (:job_id, :model, :kind, :path, :base, :block_bytes, :with_stats, 'queued', :request_id)
