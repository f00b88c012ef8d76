SELECT merge_id FROM merges
WHERE output_name = :output_name AND status IN ('queued', 'running')
