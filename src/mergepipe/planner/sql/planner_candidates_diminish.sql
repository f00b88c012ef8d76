-- Diminishing-returns rankings (utility = coverage | stratified, docs/catalog.md#rankings):
-- re-rank the units of planner_candidates_create, whose score is then the per_tensor share
-- |alpha_i| * ||D_itb|| / ||D_it||, by
--   score = share * (sqrt(k) - sqrt(k - 1))
-- where k is the unit's 1-based rank by share within its stratum: the (expert, tensor)
-- (:stratum = 'tensor', coverage) or the output region (tensor, block) over experts
-- (:stratum = 'region', stratified). For blocks of equal share this is the greedy gain of
-- sum over strata of sqrt(retained share count): the k-th unit of a stratum is worth less than
-- the first unit of another, so every stratum is touched before any is completed. Scores fall
-- along a stratum, so the static order is the greedy order of that concave objective.
--   * order: score per byte descending, then the previous rank (total: the same on every run);
--     fallback units (whole tensors of experts without statistics) keep their place, last;
--   * cost, cumulative, pass, charged: as in planner_candidates_create.
-- Strata are matched by tensor name (a LoRA expert's ordinals may differ).
CREATE OR REPLACE TEMP TABLE planner_candidates AS
WITH named AS (
    SELECT c.position, c.ordinal, c.block_index, c.n_blocks, c.nbytes, c.lora_a_nbytes,
           c.utility, c.fallback, c.missing, c.score AS share, c.unit_rank AS prior_rank,
           t.tensor AS tname
    FROM planner_candidates c
    JOIN planner_request r ON r.position = c.position
    JOIN tensors t ON t.model = r.model AND t.ordinal = c.ordinal
),
ranked AS (
    SELECT *,
           ROW_NUMBER() OVER (
               PARTITION BY fallback,
                            CASE WHEN CAST(:stratum AS VARCHAR) = 'tensor' THEN position
                                 ELSE -1 END,
                            tname,
                            CASE WHEN CAST(:stratum AS VARCHAR) = 'region' THEN block_index
                                 ELSE -1 END
               ORDER BY share DESC, prior_rank) AS k
    FROM named
),
scored AS (
    SELECT *, share * (sqrt(CAST(k AS DOUBLE PRECISION))
                       - sqrt(CAST(k - 1 AS DOUBLE PRECISION))) AS score
    FROM ranked
),
ordered AS (
    SELECT *, ROW_NUMBER() OVER (ORDER BY -(score / nbytes) NULLS LAST, prior_rank)
              AS unit_rank
    FROM scored
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
       missing, cost, score, unit_rank,
       SUM(cost) OVER (ORDER BY unit_rank ROWS UNBOUNDED PRECEDING) AS cumulative,
       CAST(NULL AS INTEGER) AS pass,   -- fill pass that selected the unit (prefix: NULL)
       CAST(0 AS BIGINT) AS charged     -- bytes charged by that fill pass
FROM costed
