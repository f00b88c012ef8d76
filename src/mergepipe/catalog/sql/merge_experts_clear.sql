DELETE FROM merge_experts WHERE merge_id = :merge_id
