SELECT * FROM merges ORDER BY created_at DESC, merge_id DESC LIMIT :limit OFFSET :offset
