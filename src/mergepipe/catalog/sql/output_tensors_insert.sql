INSERT INTO output_tensors (merge_id, tensor, dtype, shape, content_hash)
SELECT :merge_id, unnest(:tensors), unnest(:dtypes), unnest(:shapes), unnest(:hashes)
