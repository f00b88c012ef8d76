SELECT count(*) FROM touched_blocks WHERE merge_id = :merge_id
