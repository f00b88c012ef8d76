-- The files of the models named in a list, each model's in checkpoint order.
SELECT model, file_index, path, size, mtime_ns, header_len, etag, version_id FROM files
WHERE list_contains(CAST(:models AS VARCHAR[]), model) ORDER BY model, file_index
