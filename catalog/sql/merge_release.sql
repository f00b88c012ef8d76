-- Give a queued merge back (its worker stops, or its inputs are still being ingested).
UPDATE merges SET worker = NULL, lease_until = NULL
WHERE merge_id = :merge_id AND worker = :worker AND status = 'queued'
