-- Stored merges an incremental merge could start from: succeeded merges of the base and operator
-- whose output is still registered, ready, as an expert of that base, neither retired; newest
-- first.
SELECT m.merge_id, mo.name AS model, m.request, m.plan, m.omission_bound,
       m.planned_expert_bytes, m.full_read_bytes,
       (SELECT MIN(t.dtype) FROM tensors t WHERE t.model = mo.name) AS dtype_min,
       (SELECT MAX(t.dtype) FROM tensors t WHERE t.model = mo.name) AS dtype_max
FROM merges m
JOIN models mo ON mo.source_merge = m.merge_id
WHERE m.status = 'succeeded' AND m.base = :base AND m.operator = :operator
  AND mo.status = 'ready' AND mo.base = :base AND mo.kind = 'full' AND mo.has_stats
  AND m.retired_at IS NULL AND mo.retired_at IS NULL
ORDER BY m.finished_at DESC, m.merge_id
LIMIT 200
