-- Byte ranges of every tensor of a model (the base is streamed whole), for the cat/dd baseline.
SELECT f.path AS path, t.data_offset AS offset, t.nbytes AS nbytes
FROM tensors t
JOIN files f ON f.model = t.model AND f.file_index = t.file_index
WHERE t.model = :model
ORDER BY f.path, t.data_offset
