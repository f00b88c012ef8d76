-- Whether a name is in use: a version of it that is not retired.
SELECT count(*) FROM models WHERE coalesce(family, name) = :name AND retired_at IS NULL
