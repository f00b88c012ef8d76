-- Retire a finished merge: its rows stay, the listing leaves it out.
UPDATE merges SET retired_at = current_timestamp
WHERE merge_id = :merge_id AND retired_at IS NULL
  AND status IN ('succeeded', 'failed', 'cancelled')
