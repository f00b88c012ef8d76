-- The output names of merges not finished yet: they are claimed until the merge ends.
SELECT output_name FROM merges WHERE status IN ('queued', 'running') AND output_name IS NOT NULL
