-- utility=auto's statistic, per expert: how unevenly its update is spread over its tensors.
-- The coefficient of variation (population) over the tensors it changes of the per-entry RMS
-- of its update there, l2 / sqrt(numel); an expert that changes no tensor has no row.
-- Flat updates (Adam's brief fine-tunes move every entry by about the same amount) have a
-- small spread: their block norms carry little about where the update matters
-- (docs/catalog.md#rankings; the request's delta spread is the median over its experts).
SELECT model, stddev_pop(l2 / sqrt(CAST(numel AS DOUBLE PRECISION)))
              / avg(l2 / sqrt(CAST(numel AS DOUBLE PRECISION))) AS cv
FROM tensor_stats
WHERE model IN (SELECT unnest(CAST(:models AS VARCHAR[]))) AND l2 > 0 AND numel > 0
GROUP BY model
