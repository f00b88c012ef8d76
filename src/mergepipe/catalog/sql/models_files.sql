-- The files of the models named in a list, each model's in checkpoint order.
SELECT model, file_index, path, size, mtime_ns, header_len, etag, version_id FROM files
WHERE model IN (SELECT UNNEST(CAST(:models AS VARCHAR[]))) ORDER BY model, file_index
