-- One version of a name ('name~N' in requests).
SELECT * FROM models WHERE family = :family AND version = :version
