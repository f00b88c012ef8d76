-- The heartbeat of the worker holding a merge (no row: the lease was lost).
UPDATE merges SET lease_until = :until
WHERE merge_id = :merge_id AND worker = :worker AND status IN ('queued', 'running')
