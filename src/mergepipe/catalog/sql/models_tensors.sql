-- The tensors of the models named in a list, each model's in checkpoint order.
SELECT * FROM tensors WHERE model IN (SELECT UNNEST(CAST(:models AS VARCHAR[])))
ORDER BY model, ordinal
