-- The tighter omitted-update bound of additive operators: blocks of different (tensor, block)
-- occupy disjoint coordinates of the merge (every expert shares the base's block grid), so
--   ||M_full - M_A||_2 <= sqrt( sum over (tensor, block) of
--                               (sum over the omitted experts' units of utility)^2 )
-- which is at most the sum of the omitted utilities (omission_bound). Grouped by tensor name,
-- not ordinal: an expert's tensor ordinals need not match another's (LoRA adapters).
-- NULL when an omitted unit has no utility (fallback: no bound).
SELECT CASE WHEN COUNT(*) FILTER (WHERE omitted IS NULL) > 0 THEN NULL
            ELSE sqrt(COALESCE(SUM(omitted * omitted), 0)) END
FROM (
    SELECT t.tensor, c.block_index,
           CASE WHEN bool_or(c.utility IS NULL) THEN NULL ELSE SUM(c.utility) END AS omitted
    FROM planner_candidates c
    JOIN planner_request r ON r.position = c.position
    JOIN tensors t ON t.model = r.model AND t.ordinal = c.ordinal
    WHERE NOT (c.cumulative <= CAST(:budget AS BIGINT) OR c.pass IS NOT NULL)
    GROUP BY t.tensor, c.block_index
) AS per_block
