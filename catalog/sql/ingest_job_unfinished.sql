-- The newest job of every name that has no catalog model row yet (ingesting or failed).
SELECT j.* FROM ingest_jobs j
WHERE NOT EXISTS (SELECT 1 FROM models m WHERE m.name = j.model)
  AND j.status <> 'succeeded'
QUALIFY row_number() OVER (PARTITION BY j.model ORDER BY j.created_at DESC, j.job_id DESC) = 1
ORDER BY j.model
