-- A merge that will register this name as its output when it succeeds.
SELECT merge_id FROM merges WHERE output_name = :name AND status IN ('queued', 'running')
LIMIT 1
