-- The version number a new version of a name gets (retired versions count: keys are never reused).
SELECT coalesce(max(version), 0) + 1 AS version FROM models WHERE coalesce(family, name) = :family
