-- The files of a model in checkpoint order.
SELECT file_index, path, size, mtime_ns, header_len FROM files WHERE model = :model
ORDER BY file_index
