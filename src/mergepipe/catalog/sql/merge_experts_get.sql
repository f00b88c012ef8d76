SELECT position, model, weight, density, planned_bytes, bytes_read, fallback
FROM merge_experts
WHERE merge_id = :merge_id
ORDER BY position
