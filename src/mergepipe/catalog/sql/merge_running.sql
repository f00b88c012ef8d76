-- Merges marked running: after a crash, those of a process that died.
SELECT * FROM merges WHERE status = 'running' ORDER BY merge_id
