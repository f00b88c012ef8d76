-- Byte ranges of the expert blocks a merge read (its access set), for the cat/dd baseline.
SELECT f.path AS path, b.byte_offset AS offset, b.nbytes AS nbytes
FROM touched_blocks t
JOIN blocks b ON b.model = t.model AND b.tensor = t.tensor AND b.block_index = t.block_index
JOIN files f ON f.model = b.model AND f.file_index = b.file_index
WHERE t.merge_id = :merge_id
ORDER BY f.path, b.byte_offset
