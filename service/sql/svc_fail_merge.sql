UPDATE merges SET status = 'failed', error = :error, finished_at = current_timestamp
WHERE merge_id = :merge_id AND status NOT IN ('succeeded', 'failed')
