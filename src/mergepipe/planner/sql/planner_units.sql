-- The first pieces of planner_candidates.sql (WITH-list entries, not a statement): the
-- candidate units of the access set and their order by score per byte.
--   * experts with statistics: one unit per block that can contribute: utility > 0 (nonzero
--     delta, nonzero coefficient at the tensor: planner_tensor_params, else the expert's) and,
--     for ties, max |delta| >= the tensor's trim threshold tau;
--   * experts without statistics (fallback): one unit per whole tensor, ranked after every block
--     unit, in checkpoint order (tensor ordinal, then expert position).
-- Rank (ranked_units.unit_rank): score per byte, descending (score = utility; with
-- utility=per_tensor, utility divided by the L2 of the (expert, tensor) delta: |alpha_i| times
-- the block's share of that delta; with utility=activation or fisher, |alpha_i| times the
-- block's calibrated output change, planner_activation.act); ties broken by expert position,
-- tensor ordinal, block index, so the order is total and the same on every run.
-- missing: a candidate whose statistics are incomplete (the planner refuses the request).
-- Units carry the tensor's name (regions are matched by name: a LoRA expert's ordinals may
-- differ), so no later statement joins the tensors again for it.
-- The tensor_units placeholder is planner_units_fallback.sql's entry and the fallback_units
-- one its UNION ALL, when some expert has no statistics; both are empty otherwise
-- (knapsack.candidates_sql: DuckDB's optimizer then has a few ms less to do).
request_tensor_stats AS (
    -- the tensor statistics a request's expert needs (ties: the trim threshold tau at its
    -- density's grid index j; per_tensor: the tensor's l2), scalars only: the 100-entry grids
    -- stay out of the joins below
    SELECT r.position, ts.model, ts.tensor, ts.l2, len(ts.trim_tau) AS grid_len,
           ts.trim_tau[COALESCE(tp.trim_j, r.trim_j)] AS tau
    FROM planner_request r
    JOIN tensor_stats ts ON ts.model = r.model
    LEFT JOIN planner_tensor_params tp ON tp.position = r.position AND tp.tensor = ts.tensor
    WHERE r.has_stats AND (r.trim_j IS NOT NULL OR r.per_tensor)
),
block_units AS (
    SELECT r.position, t.ordinal, b.tensor, b.block_index, 1 AS n_blocks, b.nbytes,
           COALESCE(t.lora_a_nbytes, 0) AS lora_a_nbytes,
           COALESCE(tp.rank_weight, r.rank_weight) * s.l2 AS utility,
           CASE WHEN r.per_tensor
                THEN COALESCE(tp.rank_weight, r.rank_weight) * s.l2 / NULLIF(ts.l2, 0)
                WHEN r.activation
                THEN COALESCE(tp.rank_weight, r.rank_weight) * COALESCE(pa.act, 0)
                ELSE COALESCE(tp.rank_weight, r.rank_weight) * s.l2 END AS score,
           FALSE AS fallback,
           CASE WHEN s.model IS NULL THEN 'block_stats'
                WHEN r.trim_j IS NOT NULL
                     AND (ts.model IS NULL OR ts.grid_len < COALESCE(tp.trim_j, r.trim_j))
                THEN 'tensor_stats'
                WHEN r.per_tensor AND ts.model IS NULL THEN 'tensor_stats' END AS missing
    FROM planner_request r
    JOIN blocks b ON b.model = r.model
    JOIN tensors t ON t.model = b.model AND t.tensor = b.tensor
    LEFT JOIN planner_tensor_params tp ON tp.position = r.position AND tp.tensor = b.tensor
    LEFT JOIN block_stats s
        ON s.model = b.model AND s.tensor = b.tensor AND s.block_index = b.block_index
    LEFT JOIN request_tensor_stats ts ON ts.position = r.position AND ts.tensor = b.tensor
    LEFT JOIN planner_activation pa
        ON r.activation AND pa.position = r.position AND pa.tensor = b.tensor
           AND pa.block_index = b.block_index
    WHERE r.has_stats AND COALESCE(tp.rank_weight, r.rank_weight) > 0
      AND (s.model IS NULL
           OR (s.l2 > 0 AND (r.trim_j IS NULL OR ts.model IS NULL
                             OR ts.grid_len < COALESCE(tp.trim_j, r.trim_j)
                             OR s.max_abs >= ts.tau)))
),
{tensor_units}units AS (
    SELECT position, ordinal, tensor, block_index, CAST(n_blocks AS BIGINT) AS n_blocks,
           CAST(nbytes AS BIGINT) AS nbytes, CAST(lora_a_nbytes AS BIGINT) AS lora_a_nbytes,
           utility, score, fallback, missing
    FROM (SELECT * FROM block_units{fallback_units}) AS u
),
ranked_units AS (
    SELECT *,
           ROW_NUMBER() OVER (
               -- -(score / nbytes) is NULL exactly for fallback units: ranked last
               ORDER BY -(score / nbytes) NULLS LAST,
                        CASE WHEN fallback THEN ordinal ELSE position END,
                        CASE WHEN fallback THEN position ELSE ordinal END,
                        block_index) AS unit_rank
    FROM units
)
