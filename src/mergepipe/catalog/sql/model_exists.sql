SELECT count(*) FROM models WHERE name = :name
