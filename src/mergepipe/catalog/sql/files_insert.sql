-- All files of one model at once; every parameter except the model is a list, one entry per row.
INSERT INTO files (model, file_index, path, size, mtime_ns, header_len, etag, version_id)
SELECT :model, unnest(:file_index), unnest(:path), unnest(:size), unnest(:mtime_ns),
       unnest(:header_len), unnest(:etag), unnest(:version_id)
