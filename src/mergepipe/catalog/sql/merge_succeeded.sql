UPDATE merges
SET status = 'succeeded', expert_bytes_read = :expert_bytes_read,
    base_bytes_read = :base_bytes_read, output_hash = :output_hash, output_path = :output_path,
    blocks_done = blocks_total, exec_seconds = :exec_seconds, error = NULL,
    finished_at = current_timestamp
WHERE merge_id = :merge_id
  AND status = 'running'
