-- All tensor statistics of one model at once; every parameter except the model is a list (the trim_*
-- parameters are lists of lists).
INSERT INTO tensor_stats (model, tensor, numel, l2, l1, max_abs, nnz, trim_tau, trim_above,
                          trim_tied)
SELECT :model, unnest(:tensor), unnest(:numel), unnest(:l2), unnest(:l1), unnest(:max_abs),
       unnest(:nnz), unnest(:trim_tau), unnest(:trim_above), unnest(:trim_tied)
