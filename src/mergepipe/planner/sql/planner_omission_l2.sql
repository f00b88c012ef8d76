-- The tighter omitted-update bound of additive operators, and the bound of the full merge's
-- update: blocks of different (tensor, block) occupy disjoint coordinates of the merge (every
-- expert shares the base's block grid), so
--   ||M_full - M_A||_2 <= sqrt( sum over (tensor, block) of
--                               (sum over the omitted experts' units of utility)^2 )
-- which is at most the sum of the omitted utilities (omission_bound); with every unit omitted
-- (budget 0) it bounds ||M_full - base||_2, the denominator of a plan's predicted deviation
-- (docs/deviation.md#predicted-deviation). Grouped by tensor name, not ordinal: an expert's
-- tensor ordinals need not match another's (LoRA adapters). Each is NULL when a unit it sums
-- has no utility (fallback: no bound).
SELECT CASE WHEN COUNT(*) FILTER (WHERE omitted_unknown) > 0 THEN NULL
            ELSE sqrt(COALESCE(SUM(omitted * omitted), 0)) END AS omission_l2,
       CASE WHEN COUNT(*) FILTER (WHERE total_unknown) > 0 THEN NULL
            ELSE sqrt(COALESCE(SUM(total * total), 0)) END AS update_l2
FROM (
    SELECT tensor, block_index,
           bool_or(utility IS NULL AND NOT selected) AS omitted_unknown,
           SUM(utility) FILTER (WHERE NOT selected) AS omitted,
           bool_or(utility IS NULL) AS total_unknown,
           SUM(utility) AS total
    FROM (
        SELECT tensor, block_index, utility,
               cumulative <= CAST(:budget AS BIGINT) OR pass IS NOT NULL AS selected
        FROM planner_candidates
    ) AS c
    GROUP BY tensor, block_index
) AS per_block
