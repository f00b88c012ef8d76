-- A ranking piece of planner_candidates.sql (a WITH-list entry, not a statement): the
-- region-energy ranking (utility = region_energy, docs/catalog.md#rankings) for the disjoint
-- means (della): re-ranks the units of {input}, whose score is then the l2 utility
-- a_u = |alpha_i| * ||D_itb||, by
--   score = a_u^2 / E_t * (sqrt(k) - sqrt(k - 1)),   E_t = sum of a^2 over every candidate
-- unit of the tensor t (all experts), k the unit's 1-based rank by a_u among the experts of
-- its output region (tensor, block), per byte. The greedy of this order maximizes
--   sum over tensors t, regions r of t: sum over the k read experts of r of
--       a_(k)^2 / E_t * (sqrt(k) - sqrt(k - 1))
-- (for experts of equal a at r: the region's share of its tensor's energy times sqrt(experts
-- read)): the quadratic, scale-free model of the output change of tensor_energy, with the
-- diminishing returns of stratified inside a region (a mean over a few experts estimates the
-- mean over all). Scores fall along a region, so the static order is the greedy order.
-- Order: score per byte descending, then the previous (l2) rank (total: the same on every
-- run); fallback units (whole tensors of experts without statistics) keep their place, last.
-- Tensors and regions are matched by name (a LoRA expert's ordinals may differ).
region_energized AS (
    SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes, utility,
           fallback, missing, score,
           ROW_NUMBER() OVER (ORDER BY -(score / nbytes) NULLS LAST, prior_rank) AS unit_rank
    FROM (
        SELECT *, energy_share * (sqrt(CAST(k AS DOUBLE PRECISION))
                                  - sqrt(CAST(k - 1 AS DOUBLE PRECISION))) AS score
        FROM (
            SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes,
                   utility, fallback, missing, unit_rank AS prior_rank,
                   utility * utility / NULLIF(SUM(utility * utility) OVER (
                       PARTITION BY fallback, tensor), 0) AS energy_share,
                   ROW_NUMBER() OVER (PARTITION BY fallback, tensor, block_index
                                      ORDER BY utility DESC, unit_rank) AS k
            FROM {input}
        ) AS in_region
    ) AS scored
)
