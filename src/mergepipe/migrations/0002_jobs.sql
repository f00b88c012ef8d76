-- 0002: ingestion jobs of the HTTP service (a model is visible as 'ingesting' or 'failed' here
-- until its catalog rows are written in one transaction).

CREATE TABLE ingest_jobs (
    job_id       VARCHAR PRIMARY KEY,
    model        VARCHAR NOT NULL,             -- name the model will be registered under
    kind         VARCHAR NOT NULL,             -- full | delta | lora
    path         VARCHAR NOT NULL,             -- resolved path inside a data root
    base         VARCHAR,
    block_bytes  BIGINT,                       -- NULL: the default block size
    with_stats   BOOLEAN NOT NULL,
    status       VARCHAR NOT NULL,             -- queued | running | succeeded | failed
    error        VARCHAR,
    done_bytes   BIGINT NOT NULL DEFAULT 0,
    total_bytes  BIGINT NOT NULL DEFAULT 0,
    created_at   TIMESTAMP NOT NULL DEFAULT current_timestamp,
    started_at   TIMESTAMP,
    finished_at  TIMESTAMP
);
