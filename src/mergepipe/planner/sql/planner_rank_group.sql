-- A ranking piece of planner_candidates.sql (a WITH-list entry, not a statement): coherent
-- groups (planning unit "group" / "group_block") re-rank the units of {input} so that all
-- candidate experts' units of one output region (the whole tensor, :region = 'tensor', or one
-- block of it, :region = 'block') are selected or skipped together. Sign-electing and
-- normalizing operators (TIES) depend on which experts were read at a coordinate, so a partial
-- read of a region can move the output further than reading none of it.
--   * group score per byte: SUM(score) / SUM(nbytes) over the group's units (score: the units'
--     ranking score, |alpha_i| * ||D_itb||_2 or its per_tensor variant);
--   * group order (group_rank): that density descending, then tensor name, then block index:
--     total and the same on every run; fallback units (whole tensors of experts without
--     statistics) stay their own groups, ranked last in their previous order;
--   * unit_rank: group order, then expert position, then block index.
-- planner_candidates.sql then sums the cost up to the END of each unit's group, so
-- `cumulative <= B` selects whole groups. Regions are matched by tensor name, not ordinal.
grouped AS (
    SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes, utility,
           fallback, missing, score, group_rank,
           ROW_NUMBER() OVER (ORDER BY group_rank, position, block_index, prior_rank)
               AS unit_rank
    FROM (
        SELECT *,
               DENSE_RANK() OVER (ORDER BY g_neg_density NULLS LAST, g_fallback, g_tensor,
                                           g_block) AS group_rank
        FROM (
            SELECT *, -(SUM(score) OVER g / SUM(nbytes) OVER g)
                      AS g_neg_density   -- NULL exactly for fallback: ranked last
            FROM (
                SELECT *, unit_rank AS prior_rank,
                       CASE WHEN fallback THEN NULL ELSE tensor END AS g_tensor,
                       CASE WHEN fallback OR CAST(:region AS VARCHAR) = 'tensor' THEN -1
                            ELSE block_index END AS g_block,
                       CASE WHEN fallback THEN unit_rank END AS g_fallback
                FROM {input}
            ) AS named
            WINDOW g AS (PARTITION BY g_tensor, g_block, g_fallback)
        ) AS densities
    ) AS by_group
)
