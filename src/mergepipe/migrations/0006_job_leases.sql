-- 0006: several servers and workers on one catalog. A job being run holds a lease (the worker
-- and when the lease ends, renewed by its heartbeat; an expired lease lets another worker take
-- the job over); names claimed by queued and running jobs are reserved by a primary key.

ALTER TABLE ingest_jobs ADD COLUMN worker VARCHAR;
ALTER TABLE ingest_jobs ADD COLUMN lease_until TIMESTAMP;
ALTER TABLE ingest_jobs ADD COLUMN attempts INTEGER DEFAULT 0;
ALTER TABLE merges ADD COLUMN worker VARCHAR;
ALTER TABLE merges ADD COLUMN lease_until TIMESTAMP;
ALTER TABLE merges ADD COLUMN attempts INTEGER DEFAULT 0;

CREATE TABLE name_claims (
    name        VARCHAR PRIMARY KEY,           -- a model name a queued or running job will register
    job_id      VARCHAR NOT NULL,              -- ingest_jobs.job_id or merges.merge_id
    created_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);

INSERT INTO name_claims (name, job_id)
SELECT model, job_id FROM ingest_jobs WHERE status IN ('queued', 'running');
INSERT INTO name_claims (name, job_id)
SELECT output_name, merge_id FROM merges
WHERE status IN ('queued', 'running') AND output_name IS NOT NULL;
