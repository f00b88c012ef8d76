-- The rows of the models named in a list (absent names: no row).
SELECT * FROM models WHERE list_contains(CAST(:names AS VARCHAR[]), name)
