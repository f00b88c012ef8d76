-- A piece of planner_units.sql (a WITH-list entry, not a statement), there when some expert of
-- the request has no statistics: its units, one per whole tensor (ranked after every block
-- unit by planner_units.sql's ranked_units).
tensor_units AS (
    SELECT r.position, t.ordinal, t.tensor, CAST(NULL AS INTEGER) AS block_index,
           COUNT(*) AS n_blocks, SUM(b.nbytes) AS nbytes,
           COALESCE(t.lora_a_nbytes, 0) AS lora_a_nbytes,
           CAST(NULL AS DOUBLE) AS utility, CAST(NULL AS DOUBLE) AS score, TRUE AS fallback,
           CAST(NULL AS VARCHAR) AS missing
    FROM planner_request r
    JOIN tensors t ON t.model = r.model
    JOIN blocks b ON b.model = t.model AND b.tensor = t.tensor
    LEFT JOIN planner_tensor_params tp ON tp.position = r.position AND tp.tensor = t.tensor
    WHERE NOT r.has_stats AND COALESCE(tp.rank_weight, r.rank_weight) > 0
    GROUP BY r.position, t.ordinal, t.tensor, t.lora_a_nbytes
),
