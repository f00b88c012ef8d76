-- What each name of a list means: its latest ready version that is not retired (a row for each
-- name that has one; model_latest.sql for one name).
SELECT family, name FROM (
    SELECT coalesce(family, name) AS family, name,
           row_number() OVER (PARTITION BY coalesce(family, name) ORDER BY version DESC) AS rk
    FROM models
    WHERE coalesce(family, name) IN (SELECT UNNEST(CAST(:families AS VARCHAR[])))
      AND retired_at IS NULL AND status = 'ready') latest
WHERE rk = 1
