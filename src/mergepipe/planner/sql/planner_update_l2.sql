-- The full merge's update bound of additive operators: planner_omission_l2 with every unit
-- omitted (budget 0),
--   ||M_full - base||_2 <= sqrt( sum over (tensor, block) of (sum of the units' utility)^2 ),
-- the denominator of a plan's predicted deviation (docs/deviation.md#predicted-deviation).
-- NULL when a unit has no utility (fallback: no bound).
SELECT CASE WHEN COUNT(*) FILTER (WHERE total IS NULL) > 0 THEN NULL
            ELSE sqrt(COALESCE(SUM(total * total), 0)) END
FROM (
    SELECT t.tensor, c.block_index,
           CASE WHEN bool_or(c.utility IS NULL) THEN NULL ELSE SUM(c.utility) END AS total
    FROM planner_candidates c
    JOIN planner_request r ON r.position = c.position
    JOIN tensors t ON t.model = r.model AND t.ordinal = c.ordinal
    GROUP BY t.tensor, c.block_index
) AS per_block
