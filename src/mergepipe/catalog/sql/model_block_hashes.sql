-- A model's blocks as (tensor, block_index, content_hash), in no particular order.
SELECT tensor, block_index, content_hash FROM blocks WHERE model = :model
