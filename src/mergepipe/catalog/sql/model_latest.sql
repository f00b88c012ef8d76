-- What a name means: its latest ready version that is not retired.
SELECT * FROM models
WHERE coalesce(family, name) = :family AND retired_at IS NULL AND status = 'ready'
ORDER BY version DESC LIMIT 1
