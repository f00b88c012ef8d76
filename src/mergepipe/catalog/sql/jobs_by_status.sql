-- Jobs by kind and status, with the age in seconds of the oldest of each (the metrics' queue).
SELECT 'ingest' AS kind, status, count(*) AS n,
       EXTRACT(EPOCH FROM (CAST(current_timestamp AS TIMESTAMP) - min(created_at))) AS oldest_s
FROM ingest_jobs GROUP BY status
UNION ALL
SELECT 'merge' AS kind, status, count(*) AS n,
       EXTRACT(EPOCH FROM (CAST(current_timestamp AS TIMESTAMP) - min(created_at))) AS oldest_s
FROM merges GROUP BY status
ORDER BY kind, status
