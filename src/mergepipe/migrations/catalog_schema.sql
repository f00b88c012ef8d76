-- The current catalog schema. Applying migrations/ in order to an empty catalog gives exactly this
-- (tests/test_migrations.py proves it). Keep both in step: a schema change is a new migration here too.

CREATE TABLE schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        VARCHAR NOT NULL,
    applied_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE models (
    name            VARCHAR PRIMARY KEY,
    kind            VARCHAR NOT NULL,          -- full | delta | lora
    path            VARCHAR NOT NULL,          -- directory or file as given at ingestion (absolute)
    base            VARCHAR,                   -- NULL for a base model
    status          VARCHAR NOT NULL,          -- ingesting | ready | failed
    error           VARCHAR,
    has_stats       BOOLEAN NOT NULL,
    block_bytes     BIGINT NOT NULL,           -- block size of the grid (the base's)
    n_tensors       INTEGER NOT NULL,
    tensor_bytes    BIGINT NOT NULL,           -- bytes of tensor data in storage
    lora_scale      DOUBLE,                    -- lora_alpha / r (or / sqrt(r) with rslora)
    source_merge    VARCHAR,                   -- merge_id that produced this model, if any
    ingest_seconds  DOUBLE,
    created_at      TIMESTAMP NOT NULL DEFAULT current_timestamp,
    family          VARCHAR,                   -- the name users give; `name` keys one version
    version         INTEGER DEFAULT 1,         -- 1, 2, ...: name is family, then family~N
    retired_at      TIMESTAMP,                 -- removed: hidden from listings, rows kept
    delta_rel_norm      DOUBLE,                -- expert: ||E - B|| / ||B|| over its tensors
    delta_rel_norm_max  DOUBLE                 -- expert: the largest ratio of one tensor
);

CREATE TABLE files (
    model       VARCHAR NOT NULL,
    file_index  INTEGER NOT NULL,              -- order of the file in the checkpoint
    path        VARCHAR NOT NULL,              -- absolute path, or s3:// / https:// URL
    size        BIGINT NOT NULL,
    mtime_ns    BIGINT NOT NULL,               -- remote objects: Last-Modified
    header_len  BIGINT NOT NULL,               -- 8 + JSON header bytes
    etag        VARCHAR,                       -- remote objects: ETag at ingestion (else NULL)
    version_id  VARCHAR,                       -- remote objects: version id, if versioned
    PRIMARY KEY (model, file_index)
);

CREATE TABLE tensors (
    model          VARCHAR NOT NULL,
    tensor         VARCHAR NOT NULL,           -- base tensor name (LoRA keys are mapped)
    ordinal        INTEGER NOT NULL,           -- checkpoint order
    file_index     INTEGER NOT NULL,
    dtype          VARCHAR NOT NULL,           -- F32 | F16 | BF16 (LoRA: dtype of lora_B)
    shape          BIGINT[] NOT NULL,          -- LoRA: shape of lora_B
    data_offset    BIGINT NOT NULL,            -- absolute byte offset in the file
    nbytes         BIGINT NOT NULL,
    n_blocks       INTEGER NOT NULL,
    lora_a_file_index  INTEGER,                -- LoRA only: lora_A, read once per touched tensor
    lora_a_offset  BIGINT,
    lora_a_nbytes  BIGINT,
    lora_a_dtype   VARCHAR,
    lora_a_shape   BIGINT[],
    lora_scale     DOUBLE,                     -- LoRA only: this tensor's alpha / r (or / sqrt(r))
    lora_a_hash    VARCHAR,                    -- LoRA only: xxh3-128 of lora_A's raw bytes
                                               -- (NULL: ingested before migration 0004)
    value_l2       DOUBLE,                     -- a base's tensor: L2 norm of its values
    PRIMARY KEY (model, tensor)
);

CREATE TABLE blocks (
    model        VARCHAR NOT NULL,
    tensor       VARCHAR NOT NULL,
    block_index  INTEGER NOT NULL,
    row_start    BIGINT NOT NULL,              -- rows [row_start, row_end) of the base tensor
    row_end      BIGINT NOT NULL,
    file_index   INTEGER NOT NULL,
    byte_offset  BIGINT NOT NULL,              -- absolute offset of the block's bytes
    nbytes       BIGINT NOT NULL,              -- bytes read for this block (LoRA: lora_B rows)
    content_hash VARCHAR NOT NULL,             -- xxh3-128 of the raw bytes
    PRIMARY KEY (model, tensor, block_index)
);

CREATE TABLE block_stats (
    model        VARCHAR NOT NULL,
    tensor       VARCHAR NOT NULL,
    block_index  INTEGER NOT NULL,
    l2           DOUBLE NOT NULL,              -- statistics of the float32 delta against the base
    l1           DOUBLE NOT NULL,
    max_abs      DOUBLE NOT NULL,
    nnz          BIGINT NOT NULL,
    col_sq       DOUBLE[],                     -- 2-D experts: column sq. norms per channel group
    PRIMARY KEY (model, tensor, block_index)
);

CREATE TABLE tensor_stats (
    model        VARCHAR NOT NULL,
    tensor       VARCHAR NOT NULL,
    numel        BIGINT NOT NULL,
    l2           DOUBLE NOT NULL,
    l1           DOUBLE NOT NULL,
    max_abs      DOUBLE NOT NULL,
    nnz          BIGINT NOT NULL,
    trim_tau     DOUBLE[] NOT NULL,            -- [j]: k-th largest |delta|, k = int((j+1)/100 * numel)
    trim_above   BIGINT[] NOT NULL,            -- [j]: count of |delta| > tau
    trim_tied    BIGINT[] NOT NULL,            -- [j]: count of |delta| == tau
    PRIMARY KEY (model, tensor)
);

CREATE TABLE merges (
    merge_id             VARCHAR PRIMARY KEY,
    status               VARCHAR NOT NULL,     -- queued | running | succeeded | failed | cancelled
    operator             VARCHAR NOT NULL,
    base                 VARCHAR NOT NULL,
    request              JSON NOT NULL,        -- the normalized merge request
    params               JSON NOT NULL,
    seed                 BIGINT NOT NULL,
    plan_hash            VARCHAR,
    plan                 JSON,                 -- plan summary (replay re-executes touched_blocks)
    budget_bytes         BIGINT,
    full_read_bytes      BIGINT,
    planned_expert_bytes BIGINT,
    expert_bytes_read    BIGINT,
    base_bytes_read      BIGINT,
    omission_bound       DOUBLE,
    output_name          VARCHAR,
    output_path          VARCHAR,
    output_hash          VARCHAR,
    blocks_done          BIGINT NOT NULL DEFAULT 0,
    blocks_total         BIGINT NOT NULL DEFAULT 0,
    plan_seconds         DOUBLE,
    exec_seconds         DOUBLE,
    error                VARCHAR,
    created_at           TIMESTAMP NOT NULL DEFAULT current_timestamp,
    finished_at          TIMESTAMP,
    worker               VARCHAR,              -- the worker holding a running merge's lease
    lease_until          TIMESTAMP,            -- UTC; an expired lease lets another worker take over
    attempts             INTEGER DEFAULT 0,
    strategy             VARCHAR,              -- scratch | incremental (NULL: not planned yet)
    previous_merge       VARCHAR,              -- incremental: the merge whose output it reused
    retired_at           TIMESTAMP,            -- removed: hidden from listings, rows kept
    request_id           VARCHAR               -- X-Request-ID of the request that queued it
);

CREATE TABLE merge_experts (
    merge_id       VARCHAR NOT NULL,
    position       INTEGER NOT NULL,
    model          VARCHAR NOT NULL,
    weight         DOUBLE NOT NULL,
    density        DOUBLE,
    planned_bytes  BIGINT NOT NULL,
    bytes_read     BIGINT,
    fallback       BOOLEAN NOT NULL,           -- planned at tensor granularity (no statistics)
    PRIMARY KEY (merge_id, position)
);

CREATE TABLE touched_blocks (
    merge_id     VARCHAR NOT NULL,
    model        VARCHAR NOT NULL,
    tensor       VARCHAR NOT NULL,
    block_index  INTEGER NOT NULL,
    nbytes       BIGINT NOT NULL,
    utility      DOUBLE NOT NULL,
    rank         INTEGER NOT NULL,             -- position in the planner's order
    PRIMARY KEY (merge_id, model, tensor, block_index)
);

CREATE TABLE output_tensors (
    merge_id     VARCHAR NOT NULL,
    tensor       VARCHAR NOT NULL,
    dtype        VARCHAR NOT NULL,
    shape        BIGINT[] NOT NULL,
    content_hash VARCHAR NOT NULL,
    PRIMARY KEY (merge_id, tensor)
);

CREATE TABLE lineage (
    child     VARCHAR NOT NULL,
    parent    VARCHAR NOT NULL,
    role      VARCHAR NOT NULL,                -- base | expert | previous (reused merge)
    weight    DOUBLE,
    merge_id  VARCHAR NOT NULL,
    PRIMARY KEY (child, parent, merge_id)
);

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
    finished_at  TIMESTAMP,
    worker       VARCHAR,                      -- the worker holding a running job's lease
    lease_until  TIMESTAMP,                    -- UTC; an expired lease lets another worker take over
    attempts     INTEGER DEFAULT 0,
    force_base   BOOLEAN NOT NULL DEFAULT FALSE,  -- ingest even if far from its base
    request_id   VARCHAR                       -- X-Request-ID of the request that queued it
);

CREATE TABLE name_claims (
    name        VARCHAR PRIMARY KEY,           -- a model name a queued or running job will register
    job_id      VARCHAR NOT NULL,              -- ingest_jobs.job_id or merges.merge_id
    created_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE calibrations (
    calibration_id VARCHAR PRIMARY KEY,        -- sha256 prefix of (model, text, tokens, values)
    model          VARCHAR NOT NULL,           -- the base (model key with its version)
    text_sha256    VARCHAR NOT NULL,           -- of the calibration text's UTF-8 bytes
    tokens         BIGINT NOT NULL,            -- tokens the model ran over
    fallback_rms   DOUBLE NOT NULL,            -- sqrt(mean square channel RMS) over all tensors
    fallback_fisher DOUBLE NOT NULL,           -- mean Fisher diagonal over all parameters
    created_at     TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE calibration_rms (
    calibration_id VARCHAR NOT NULL,
    tensor         VARCHAR NOT NULL,           -- a linear weight of the base (out x in)
    rms            DOUBLE[] NOT NULL,          -- [j]: RMS of input channel j (length in)
    group_ms       DOUBLE[] NOT NULL,          -- [g]: mean of rms^2 over channel group g
    PRIMARY KEY (calibration_id, tensor)
);

CREATE TABLE calibration_blocks (
    calibration_id VARCHAR NOT NULL,
    tensor         VARCHAR NOT NULL,
    block_index    INTEGER NOT NULL,           -- the base's block grid
    fisher         DOUBLE[] NOT NULL,          -- mean Fisher diagonal per channel group (or 1)
    PRIMARY KEY (calibration_id, tensor, block_index)
);
