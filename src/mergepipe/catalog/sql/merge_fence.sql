-- Fencing: the merge is still held by :worker under an unexpired lease. The row stays locked
-- until the caller's transaction ends, so that no other worker takes it over meanwhile.
SELECT merge_id FROM merges
WHERE merge_id = :merge_id AND worker = :worker AND lease_until > :now
  AND status IN ('queued', 'running')
FOR UPDATE
