SELECT
  (SELECT count(*) FROM ingest_jobs WHERE status = 'queued')
  + (SELECT count(*) FROM merges WHERE status = 'queued') AS queued,
  (SELECT count(*) FROM ingest_jobs WHERE status = 'running')
  + (SELECT count(*) FROM merges WHERE status = 'running') AS running
