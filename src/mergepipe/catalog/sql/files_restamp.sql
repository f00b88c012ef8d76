-- A file re-verified by content hash (or re-ingested with the same content): its new stamp.
UPDATE files SET path = :path, size = :size, mtime_ns = :mtime_ns, header_len = :header_len,
                 etag = :etag, version_id = :version_id
WHERE model = :model AND file_index = :file_index
