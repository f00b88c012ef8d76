-- Reserve a model name for a queued job (the primary key refuses a name claimed twice).
INSERT INTO name_claims (name, job_id) VALUES (:name, :job_id)
