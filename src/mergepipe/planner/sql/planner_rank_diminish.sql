-- A ranking piece of planner_candidates.sql (a WITH-list entry, not a statement): the
-- diminishing-returns rankings (utility = coverage | stratified, docs/catalog.md#rankings)
-- re-rank the units of {input}, whose score is then the per_tensor share
-- |alpha_i| * ||D_itb|| / ||D_it||, by
--   score = share * (sqrt(k) - sqrt(k - 1))
-- where k is the unit's 1-based rank by share within its stratum: the (expert, tensor)
-- (:stratum = 'tensor', coverage) or the output region (tensor, block) over experts
-- (:stratum = 'region', stratified). For blocks of equal share this is the greedy gain of
-- sum over strata of sqrt(retained share count): the k-th unit of a stratum is worth less than
-- the first unit of another, so every stratum is touched before any is completed. Scores fall
-- along a stratum, so the static order is the greedy order of that concave objective.
-- Order: score per byte descending, then the previous rank (total: the same on every run);
-- fallback units (whole tensors of experts without statistics) keep their place, last.
-- Strata are matched by tensor name (a LoRA expert's ordinals may differ).
diminished AS (
    SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes, utility,
           fallback, missing, score,
           ROW_NUMBER() OVER (ORDER BY -(score / nbytes) NULLS LAST, prior_rank) AS unit_rank
    FROM (
        SELECT *, share * (sqrt(CAST(k AS DOUBLE PRECISION))
                           - sqrt(CAST(k - 1 AS DOUBLE PRECISION))) AS score
        FROM (
            SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes,
                   utility, fallback, missing, score AS share,
                   unit_rank AS prior_rank,
                   ROW_NUMBER() OVER (
                       PARTITION BY fallback,
                                    CASE WHEN CAST(:stratum AS VARCHAR) = 'tensor' THEN position
                                         ELSE -1 END,
                                    tensor,
                                    CASE WHEN CAST(:stratum AS VARCHAR) = 'region'
                                         THEN block_index ELSE -1 END
                       ORDER BY score DESC, unit_rank) AS k
            FROM {input}
        ) AS in_stratum
    ) AS scored
)
