-- Every edge below a model, recursively over chained merges (depth 1: merges it fed directly).
WITH RECURSIVE down(child, parent, role, weight, merge_id, depth) AS (
    SELECT child, parent, role, weight, merge_id, 1 FROM lineage WHERE parent = :name
    UNION ALL
    SELECT l.child, l.parent, l.role, l.weight, l.merge_id, down.depth + 1
    FROM lineage l JOIN down ON l.parent = down.child
    WHERE down.depth < :max_depth
)
SELECT child, parent, role, weight, merge_id, min(depth) AS depth
FROM down GROUP BY child, parent, role, weight, merge_id
ORDER BY depth, child, role, parent
