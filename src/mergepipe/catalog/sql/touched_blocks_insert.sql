INSERT INTO touched_blocks (merge_id, model, tensor, block_index, nbytes, utility, rank)
SELECT :merge_id, unnest(:models), unnest(:tensors), unnest(:block_indexes), unnest(:nbytes),
       unnest(:utilities), unnest(:ranks)
