-- Take the lease of a merge; a merge taken over goes back to queued (its plan is made again).
UPDATE merges
SET worker = :worker, lease_until = :until, attempts = COALESCE(attempts, 0) + 1,
    status = 'queued', blocks_done = 0, error = NULL
WHERE merge_id = :merge_id
