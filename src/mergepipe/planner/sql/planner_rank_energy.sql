-- A ranking piece of planner_candidates.sql (a WITH-list entry, not a statement): the quadratic
-- ranking (utility = tensor_energy, docs/catalog.md#rankings) re-ranks the units of {input},
-- whose score is then the l2 utility a_u = |alpha_i| * ||D_itb||, by
--   score = a_u^2 / E_t,   E_t = sum of a^2 over every candidate unit of the tensor t
-- (all experts), per byte. The greedy of this order minimizes
--   sum over tensors t of (omitted energy of t) / E_t,
-- a quadratic model of the output change (KL is quadratic in a small weight change) in which
-- each tensor's whole update weighs the same, whatever its scale: within a tensor the largest
-- deltas go first (unlike per_tensor, linear in a_u), across tensors the scale is divided out
-- (unlike l2).
-- Order: score per byte descending, then the previous (l2) rank (total: the same on every
-- run); fallback units (whole tensors of experts without statistics) keep their place, last.
-- Tensors are matched by name (a LoRA expert's ordinals may differ).
energized AS (
    SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes, utility,
           fallback, missing, score,
           ROW_NUMBER() OVER (ORDER BY -(score / nbytes) NULLS LAST, prior_rank) AS unit_rank
    FROM (
        SELECT position, ordinal, tensor, block_index, n_blocks, nbytes, lora_a_nbytes,
               utility, fallback, missing, unit_rank AS prior_rank,
               utility * utility / NULLIF(SUM(utility * utility) OVER (
                   PARTITION BY fallback, tensor), 0) AS score
        FROM {input}
    ) AS scored
)
