-- Per base tensor and expert of a merge, in the base's checkpoint order: the expert's stored
-- bytes and blocks of the tensor (NULL where it stores none, e.g. a LoRA adapter's untouched
-- modules) and how many of them the merge's access set (touched_blocks) read.
SELECT me.position, me.model, bt.tensor, bt.ordinal,
       t.nbytes AS tensor_bytes, t.n_blocks AS blocks,
       COALESCE(SUM(tb.nbytes), 0) AS read_bytes, COUNT(tb.block_index) AS read_blocks
FROM merges m
JOIN merge_experts me ON me.merge_id = m.merge_id
JOIN tensors bt ON bt.model = m.base
LEFT JOIN tensors t ON t.model = me.model AND t.tensor = bt.tensor
LEFT JOIN touched_blocks tb
    ON tb.merge_id = m.merge_id AND tb.model = me.model AND tb.tensor = bt.tensor
WHERE m.merge_id = :merge_id
GROUP BY me.position, me.model, bt.tensor, bt.ordinal, t.nbytes, t.n_blocks
ORDER BY bt.ordinal, me.position
