-- Merges that are not retired, newest first.
SELECT * FROM merges WHERE retired_at IS NULL
ORDER BY created_at DESC, merge_id DESC LIMIT :limit OFFSET :offset
