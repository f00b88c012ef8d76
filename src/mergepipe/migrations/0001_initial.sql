-- 0001: models, their files, tensors and blocks, delta statistics, merges and lineage.

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
    created_at      TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE files (
    model       VARCHAR NOT NULL,
    file_index  INTEGER NOT NULL,              -- order of the file in the checkpoint
    path        VARCHAR NOT NULL,              -- absolute path
    size        BIGINT NOT NULL,
    mtime_ns    BIGINT NOT NULL,
    header_len  BIGINT NOT NULL,               -- 8 + JSON header bytes
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
    status               VARCHAR NOT NULL,     -- queued | running | succeeded | failed
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
    finished_at          TIMESTAMP
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
    role      VARCHAR NOT NULL,                -- base | expert
    weight    DOUBLE,
    merge_id  VARCHAR NOT NULL,
    PRIMARY KEY (child, parent, merge_id)
);
