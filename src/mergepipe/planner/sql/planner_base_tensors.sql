-- The base's tensors (name, shape) in checkpoint order: where per-tensor parameters resolve.
SELECT tensor, shape FROM tensors WHERE model = :model ORDER BY ordinal
