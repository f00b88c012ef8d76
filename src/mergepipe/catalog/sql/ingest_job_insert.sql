INSERT INTO ingest_jobs (job_id, model, kind, path, base, block_bytes, with_stats, force_base,
                         status, request_id)
VALUES (:job_id, :model, :kind, :path, :base, :block_bytes, :with_stats, :force_base, 'queued',
        :request_id)
