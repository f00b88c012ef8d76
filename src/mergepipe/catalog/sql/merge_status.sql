SELECT status FROM merges WHERE merge_id = :merge_id
