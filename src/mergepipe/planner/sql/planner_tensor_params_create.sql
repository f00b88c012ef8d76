-- Per-(expert, tensor) values of a request with per-tensor parameters (a mergekit config's
-- gradients and filter: values), overriding planner_request's per-expert ones; empty otherwise.
CREATE OR REPLACE TEMP TABLE planner_tensor_params (
    position     INTEGER NOT NULL,   -- the expert's position in the request
    tensor       VARCHAR NOT NULL,
    rank_weight  DOUBLE NOT NULL,    -- |alpha_i| at this tensor
    trim_j       INTEGER             -- ties: the trim-grid index of the density at this tensor
)
