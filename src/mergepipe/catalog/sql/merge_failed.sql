-- A merge failed: the one place its error is recorded (never over a succeeded merge).
UPDATE merges
SET status = 'failed', error = :error, exec_seconds = :exec_seconds,
    finished_at = current_timestamp
WHERE merge_id = :merge_id AND status <> 'succeeded'
