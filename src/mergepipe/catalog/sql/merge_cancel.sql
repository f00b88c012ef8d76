-- Cancel a queued or running merge; a running one stops at its next progress report.
UPDATE merges SET status = 'cancelled', error = :error, finished_at = current_timestamp,
                  lease_until = NULL
WHERE merge_id = :merge_id AND status IN ('queued', 'running')
