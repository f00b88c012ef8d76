-- A merge with overwrite replaces the live versions of its output name and any live model whose
-- files were in the replaced output directory.
UPDATE models SET retired_at = current_timestamp
WHERE retired_at IS NULL AND (coalesce(family, name) = :family OR path = :path)
