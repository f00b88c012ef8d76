-- The ranked candidate units of the request loaded in this connection, with the knapsack's
-- prefix sums: one statement made of planner_units.sql's pieces, then the ranking pieces the
-- request asks for (planner_rank_*.sql, each re-ranking the units as ranked so far), then this
-- costing, shared by every ranking (`ranked`: the last piece's units):
--   * cost: bytes of the unit, plus a LoRA expert's lora_A on the first unit of each (expert,
--     tensor) in rank order (lora_A is read once per touched tensor; all units of an (expert,
--     tensor) share it, so only units with lora_A bytes are numbered);
--   * group_rank: the unit's coherent group (planner_rank_group.sql's, else the unit's own
--     rank); cumulative: running cost in group order up to the END of the unit's group, so
--     the knapsack prefix under budget B is `cumulative <= B` (whole groups), and SUM(cost) =
--     C_full;
--   * pass, charged: the fill pass that selected the unit and the bytes it charged (the prefix:
--     NULL, 0; planner_fill_pass*.sql set them).
CREATE OR REPLACE TEMP TABLE planner_candidates AS
WITH {pieces},
ranked AS MATERIALIZED (SELECT * FROM {input}),
costed AS (
    SELECT *, nbytes AS cost FROM ranked WHERE lora_a_nbytes = 0
    UNION ALL
    SELECT *, nbytes + CASE
               WHEN ROW_NUMBER() OVER (PARTITION BY position, ordinal ORDER BY unit_rank) = 1
               THEN lora_a_nbytes ELSE 0 END AS cost
    FROM ranked WHERE lora_a_nbytes > 0
)
SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes, utility,
       fallback, missing, cost, score, unit_rank, {group_rank} AS group_rank,
       SUM(cost) OVER (ORDER BY {group_rank} RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
           AS cumulative,
       CAST(NULL AS INTEGER) AS pass,
       CAST(0 AS BIGINT) AS charged
FROM costed
