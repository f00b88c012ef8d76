UPDATE merges SET status = 'running', error = NULL
WHERE merge_id = :merge_id AND status = 'queued'
