-- The files of a model in checkpoint order.
SELECT file_index, path, size, mtime_ns, header_len, etag, version_id FROM files
WHERE model = :model ORDER BY file_index
