-- utility=auto's statistic: how unevenly the experts' updates are spread over their tensors.
-- Per expert, the coefficient of variation (population) over the tensors it changes of the
-- per-entry RMS of its update there, l2 / sqrt(numel); the median over the experts (NULL:
-- no expert with statistics changes a tensor). Flat updates (Adam's brief fine-tunes move
-- every entry by about the same amount) have a small spread: their block norms carry little
-- about where the update matters (docs/catalog.md#rankings).
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY cv) AS spread
FROM (
    SELECT model, stddev_pop(l2 / sqrt(CAST(numel AS DOUBLE PRECISION)))
                  / avg(l2 / sqrt(CAST(numel AS DOUBLE PRECISION))) AS cv
    FROM tensor_stats
    WHERE model IN (SELECT unnest(CAST(:models AS VARCHAR[]))) AND l2 > 0 AND numel > 0
    GROUP BY model
) AS per_expert
