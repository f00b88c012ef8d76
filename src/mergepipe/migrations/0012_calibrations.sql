-- 0012: calibration-aware planning (docs/catalog.md#calibrations). block_stats.col_sq: per block
-- of a 2-D expert tensor, the squared L2 norms of its delta's columns (input channels), summed
-- into 16 equal channel groups (NULL: other tensors, bases, rows ingested before this
-- migration). calibrations: one run of a base over a calibration text; calibration_rms: per
-- linear weight of the base, the RMS of each input channel over the text's tokens (rms) and
-- the mean square of rms over each of the same 16 channel groups (group_ms); calibration_blocks:
-- per block of the base's grid, the mean of the diagonal empirical Fisher information of its
-- entries, per channel group (2-D tensors cut into rows) or over the whole block (one value).

ALTER TABLE block_stats ADD COLUMN col_sq DOUBLE[];

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
