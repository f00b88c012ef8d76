-- The versions of a name that are not retired, oldest first.
SELECT * FROM models WHERE coalesce(family, name) = :family AND retired_at IS NULL ORDER BY version
