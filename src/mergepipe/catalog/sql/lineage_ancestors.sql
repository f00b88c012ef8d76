-- Every edge above a model, recursively over chained merges (depth 1: its direct parents).
WITH RECURSIVE up(child, parent, role, weight, merge_id, depth) AS (
    SELECT child, parent, role, weight, merge_id, 1 FROM lineage WHERE child = :name
    UNION ALL
    SELECT l.child, l.parent, l.role, l.weight, l.merge_id, up.depth + 1
    FROM lineage l JOIN up ON l.child = up.parent
    WHERE up.depth < :max_depth
)
SELECT child, parent, role, weight, merge_id, min(depth) AS depth
FROM up GROUP BY child, parent, role, weight, merge_id
ORDER BY depth, child, role, parent
