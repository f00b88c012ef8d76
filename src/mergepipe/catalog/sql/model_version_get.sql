-- One version of a name ('name~N' in requests).
SELECT * FROM models WHERE coalesce(family, name) = :family AND version = :version
