-- The base's tensors in checkpoint order with one expert's stored bytes and blocks of each
-- (NULL where the expert stores none): the grid a dry plan's access set is summed onto.
SELECT bt.tensor, bt.ordinal, t.nbytes AS tensor_bytes, t.n_blocks AS blocks
FROM tensors bt
LEFT JOIN tensors t ON t.model = :model AND t.tensor = bt.tensor
WHERE bt.model = :base
ORDER BY bt.ordinal
