-- All blocks of one model at once; every parameter except the model is a list, one entry per row.
INSERT INTO blocks (model, tensor, block_index, row_start, row_end, file_index, byte_offset,
                    nbytes, content_hash)
SELECT :model, unnest(:tensor), unnest(:block_index), unnest(:row_start), unnest(:row_end),
       unnest(:file_index), unnest(:byte_offset), unnest(:nbytes), unnest(:content_hash)
