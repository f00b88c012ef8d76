-- 0008: model versions and retirement (docs/lifecycle.md). A model name (`family`) may have
-- several versions; `models.name` stays the key of one version: the family itself for version 1,
-- 'family~N' for version N >= 2 (a name can never hold '~'). A retired model or merge keeps its
-- rows and lineage but leaves the listings; a merge can also end 'cancelled'.

ALTER TABLE models ADD COLUMN family VARCHAR;
ALTER TABLE models ADD COLUMN version INTEGER DEFAULT 1;
ALTER TABLE models ADD COLUMN retired_at TIMESTAMP;
UPDATE models SET family = name, version = 1;
ALTER TABLE merges ADD COLUMN retired_at TIMESTAMP;
