-- 0007: how a merge was computed (docs/incremental.md): strategy 'scratch' or 'incremental', and
-- for an incremental merge the stored merge whose output it reused (previous_merge). NULL for
-- merges recorded before this migration and for merges not planned yet.

ALTER TABLE merges ADD COLUMN strategy VARCHAR;
ALTER TABLE merges ADD COLUMN previous_merge VARCHAR;
