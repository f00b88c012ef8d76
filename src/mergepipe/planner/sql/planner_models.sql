-- The catalog rows of the models named in a merge request.
SELECT * FROM models WHERE list_contains(CAST(:names AS VARCHAR[]), name)
