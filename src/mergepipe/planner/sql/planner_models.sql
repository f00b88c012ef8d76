-- The catalog rows of the models named in a merge request.
SELECT * FROM models WHERE name IN (SELECT UNNEST(CAST(:names AS VARCHAR[])))
