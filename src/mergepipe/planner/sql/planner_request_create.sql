-- The request's experts, as rows the planner's queries join against (one per connection).
CREATE OR REPLACE TEMP TABLE planner_request (
    position     INTEGER NOT NULL,   -- position of the expert in the request (tie-break)
    model        VARCHAR NOT NULL,
    rank_weight  DOUBLE NOT NULL,    -- |alpha_i|: utility of a block = rank_weight * l2
    trim_j       INTEGER,            -- ties: 1-based index into tensor_stats.trim_* (= density*100)
    has_stats    BOOLEAN NOT NULL,   -- false: planned whole tensors (fallback)
    per_tensor   BOOLEAN NOT NULL    -- rank by utility / ||D_it||_2 (params.utility = per_tensor)
)
