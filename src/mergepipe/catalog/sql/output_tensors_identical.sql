-- How many of a merge's output tensors are bit-identical (same content hash) to the same
-- tensor of a reference merge's output.
SELECT COUNT(*) AS tensors,
       COUNT(*) FILTER (WHERE r.content_hash = o.content_hash) AS identical
FROM output_tensors o
LEFT JOIN output_tensors r ON r.merge_id = :reference AND r.tensor = o.tensor
WHERE o.merge_id = :merge_id
