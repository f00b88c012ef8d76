-- One merge by id.
SELECT * FROM merges WHERE merge_id = :merge_id
