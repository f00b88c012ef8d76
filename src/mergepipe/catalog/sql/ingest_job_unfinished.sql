-- The newest job of every name that has no catalog model row yet (ingesting or failed).
SELECT * FROM (
    SELECT j.*, row_number() OVER (PARTITION BY j.model
                                   ORDER BY j.created_at DESC, j.job_id DESC) AS newest
    FROM ingest_jobs j
    WHERE NOT EXISTS (SELECT 1 FROM models m WHERE m.name = j.model)
      AND j.status <> 'succeeded'
) AS unfinished
WHERE newest = 1
ORDER BY model
