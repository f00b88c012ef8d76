-- Queued and running merges.
SELECT * FROM merges WHERE status IN ('queued', 'running')
