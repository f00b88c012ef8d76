-- sha256 of the access set in rank order: one line per block, fields separated by U+001F:
-- model, tensor, block_index, content_hash (identifies exactly which bytes the merge reads).
SELECT sha256(COALESCE(string_agg(
           model || chr(31) || tensor || chr(31) || CAST(block_index AS VARCHAR) || chr(31)
           || content_hash, chr(10) ORDER BY unit_rank, block_index), ''))
FROM planner_access
