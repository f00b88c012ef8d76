INSERT INTO lineage (child, parent, role, weight, merge_id)
VALUES (:child, :parent, :role, :weight, :merge_id)
