-- 0011: the request id (X-Request-ID) of the HTTP request that queued each job, so a job's log
-- lines and rows can be followed back to the request that made it. NULL for jobs queued
-- outside the HTTP API (the CLI) and for jobs recorded before this migration.

ALTER TABLE merges ADD COLUMN request_id VARCHAR;
ALTER TABLE ingest_jobs ADD COLUMN request_id VARCHAR;
