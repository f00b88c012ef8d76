UPDATE merge_experts SET bytes_read = :bytes_read
WHERE merge_id = :merge_id AND model = :model
