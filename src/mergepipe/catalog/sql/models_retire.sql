-- Retire model versions: their rows and lineage stay, the listings leave them out.
UPDATE models SET retired_at = current_timestamp
WHERE name IN (SELECT UNNEST(CAST(:names AS VARCHAR[]))) AND retired_at IS NULL
