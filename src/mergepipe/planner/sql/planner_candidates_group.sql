-- Coherent groups (planning unit "group" / "group_block"): re-rank the candidate units of
-- planner_candidates_create so that all candidate experts' units of one output region (the
-- whole tensor, :region = 'tensor', or one block of it, :region = 'block') are selected or
-- skipped together. Sign-electing and normalizing operators (TIES) depend on which experts
-- were read at a coordinate, so a partial read of a region can move the output further than
-- reading none of it.
--   * group score per byte: SUM(score) / SUM(nbytes) over the group's units (score: the units'
--     ranking score, |alpha_i| * ||D_itb||_2 or its per_tensor variant);
--   * group order: that density descending, then tensor name, then block index: total and the
--     same on every run; fallback units (whole tensors of experts without statistics) stay
--     their own groups, ranked last in their previous order;
--   * unit_rank: group order, then expert position, then block index;
--   * cost: bytes, plus lora_A on the first unit of each (expert, tensor) in the new order
--     (only units with lora_A bytes are numbered: all units of an (expert, tensor) share them);
--   * cumulative: running cost up to the END of the unit's group (RANGE over the group rank),
--     so `cumulative <= B` selects whole groups, and SUM(cost) is still C_full.
-- Regions are matched by tensor name, not ordinal (a LoRA expert's ordinals may differ).
CREATE OR REPLACE TEMP TABLE planner_candidates AS
WITH named AS (
    SELECT c.position, c.ordinal, c.block_index, c.n_blocks, c.nbytes, c.lora_a_nbytes,
           c.utility, c.fallback, c.missing, c.score, c.unit_rank AS prior_rank,
           CASE WHEN c.fallback THEN NULL ELSE t.tensor END AS g_tensor,
           CASE WHEN c.fallback OR CAST(:region AS VARCHAR) = 'tensor' THEN -1
                ELSE c.block_index END AS g_block,
           CASE WHEN c.fallback THEN c.unit_rank END AS g_fallback
    FROM planner_candidates c
    JOIN planner_request r ON r.position = c.position
    JOIN tensors t ON t.model = r.model AND t.ordinal = c.ordinal
),
densities AS (
    SELECT *, -(SUM(score) OVER g / SUM(nbytes) OVER g)
              AS g_neg_density   -- NULL exactly for fallback: ranked last
    FROM named
    WINDOW g AS (PARTITION BY g_tensor, g_block, g_fallback)
),
ranked AS (
    SELECT *,
           DENSE_RANK() OVER (ORDER BY g_neg_density NULLS LAST, g_fallback, g_tensor,
                                       g_block) AS group_rank
    FROM densities
),
ordered AS (
    SELECT *, ROW_NUMBER() OVER (ORDER BY group_rank, position, block_index, prior_rank)
              AS unit_rank
    FROM ranked
),
costed AS (
    SELECT *, nbytes AS cost FROM ordered WHERE lora_a_nbytes = 0
    UNION ALL
    SELECT *, nbytes + CASE
               WHEN ROW_NUMBER() OVER (PARTITION BY position, ordinal ORDER BY unit_rank) = 1
               THEN lora_a_nbytes ELSE 0 END AS cost
    FROM ordered WHERE lora_a_nbytes > 0
)
SELECT position, ordinal, block_index, n_blocks, nbytes, lora_a_nbytes, utility, fallback,
       missing, cost, score, unit_rank, group_rank,
       SUM(cost) OVER (ORDER BY group_rank RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
           AS cumulative,
       CAST(NULL AS INTEGER) AS pass,   -- fill pass that selected the unit (prefix: NULL)
       CAST(0 AS BIGINT) AS charged     -- bytes charged by that fill pass
FROM costed
