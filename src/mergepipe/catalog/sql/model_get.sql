-- One model row by name.
SELECT * FROM models WHERE name = :name
