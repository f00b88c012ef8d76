SELECT tensor, dtype, shape, content_hash
FROM output_tensors
WHERE merge_id = :merge_id
ORDER BY tensor
