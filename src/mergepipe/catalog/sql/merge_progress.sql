UPDATE merges SET blocks_done = :blocks_done, expert_bytes_read = :expert_bytes_read,
                  base_bytes_read = :base_bytes_read
WHERE merge_id = :merge_id AND status = 'running'
