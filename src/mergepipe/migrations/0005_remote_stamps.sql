-- 0005: how a remote object looked at ingestion, for the drift check and for reading exactly
-- that version: its ETag and version id (S3 with versioning). NULL for local files, which keep
-- size + mtime_ns; a remote object's mtime_ns is its Last-Modified.

ALTER TABLE files ADD COLUMN etag VARCHAR;
ALTER TABLE files ADD COLUMN version_id VARCHAR;
