-- Give a queued merge back (its worker stops, or its inputs are still being ingested).
-- :not_before: no worker claims it again before then (NULL: at once).
UPDATE merges SET worker = NULL, lease_until = :not_before
WHERE merge_id = :merge_id AND worker = :worker AND status = 'queued'
