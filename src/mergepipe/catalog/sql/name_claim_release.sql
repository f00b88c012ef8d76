-- A job ended: the name it claimed is free again (or a model row holds it now).
DELETE FROM name_claims WHERE job_id = :job_id
