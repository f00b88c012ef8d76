-- The tensors of a model in checkpoint order.
SELECT * FROM tensors WHERE model = :model ORDER BY ordinal
