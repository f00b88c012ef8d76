-- Named blocks (a plan's access set): three lists of equal length, (model, tensor, block_index)
-- at each position. Blocks not in the catalog are simply absent.
SELECT b.model, b.tensor, b.block_index, b.row_start, b.row_end, b.file_index, b.byte_offset,
       b.nbytes, b.content_hash
FROM blocks b
JOIN (SELECT UNNEST(CAST(:models AS VARCHAR[])) AS model,
             UNNEST(CAST(:tensors AS VARCHAR[])) AS tensor,
             UNNEST(CAST(:block_indexes AS BIGINT[])) AS block_index) p
  ON p.model = b.model AND p.tensor = b.tensor AND p.block_index = b.block_index
