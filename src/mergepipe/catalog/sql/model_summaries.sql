-- Per model that is not retired: its block count, the statistics of its delta against the base summed over its
-- tensors (experts with statistics; NULL otherwise) and its lineage depth (longest chain of
-- merges above it; 0 for an ingested checkpoint).
WITH RECURSIVE up(child, parent, depth) AS (
    SELECT child, parent, 1 FROM lineage
    UNION ALL
    SELECT up.child, l.parent, up.depth + 1
    FROM up JOIN lineage l ON l.child = up.parent
    WHERE up.depth < :max_depth
),
depths AS (SELECT child AS name, MAX(depth) AS lineage_depth FROM up GROUP BY child),
stats AS (
    SELECT model AS name, SQRT(SUM(l2 * l2)) AS delta_l2, SUM(l1) AS delta_l1,
           MAX(max_abs) AS delta_max_abs, SUM(nnz) AS delta_nnz, SUM(numel) AS numel
    FROM tensor_stats GROUP BY model
),
nblocks AS (SELECT model AS name, COUNT(*) AS n_blocks FROM blocks GROUP BY model)
SELECT m.name, COALESCE(b.n_blocks, 0) AS n_blocks, s.delta_l2, s.delta_l1, s.delta_max_abs,
       s.delta_nnz, s.numel, COALESCE(d.lineage_depth, 0) AS lineage_depth
FROM models m
LEFT JOIN nblocks b ON b.name = m.name
LEFT JOIN stats s ON s.name = m.name
LEFT JOIN depths d ON d.name = m.name
WHERE m.retired_at IS NULL
ORDER BY m.name
