-- sha256 of a model's block content hashes in checkpoint order (the base's identity in the plan
-- hash: a changed base changes every plan made on it). Same line format as the access digest.
SELECT sha256(COALESCE(string_agg(
           b.tensor || chr(31) || CAST(b.block_index AS VARCHAR) || chr(31) || b.content_hash,
           chr(10) ORDER BY t.ordinal, b.block_index), ''))
FROM blocks b
JOIN tensors t ON t.model = b.model AND t.tensor = b.tensor
WHERE b.model = :model
