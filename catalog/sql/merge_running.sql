SELECT merge_id, output_path FROM merges WHERE status = 'running' ORDER BY merge_id
