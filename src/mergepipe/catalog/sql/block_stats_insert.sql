-- All block statistics of one model at once; every parameter except the model is a list
-- (col_sq: a list of lists, NULL for tensors that are not 2-D).
INSERT INTO block_stats (model, tensor, block_index, l2, l1, max_abs, nnz, col_sq)
SELECT :model, unnest(:tensor), unnest(:block_index), unnest(:l2), unnest(:l1),
       unnest(:max_abs), unnest(:nnz), unnest(:col_sq)
