-- The rows of the models named in a list (absent names: no row).
SELECT * FROM models WHERE name IN (SELECT UNNEST(CAST(:names AS VARCHAR[])))
