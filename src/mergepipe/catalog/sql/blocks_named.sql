-- Named blocks of some models (a plan's access set): :keys lists model || chr(31) || tensor ||
-- chr(31) || block_index for each (faster here than a join on three unnested lists). Blocks not
-- in the catalog are absent; a name holding chr(31) can only add real blocks of those models.
SELECT b.model, b.tensor, b.block_index, b.row_start, b.row_end, b.file_index, b.byte_offset,
       b.nbytes, b.content_hash
FROM blocks b
WHERE list_contains(CAST(:models AS VARCHAR[]), b.model)
  AND b.model || chr(31) || b.tensor || chr(31) || CAST(b.block_index AS VARCHAR)
      IN (SELECT UNNEST(CAST(:keys AS VARCHAR[])))
