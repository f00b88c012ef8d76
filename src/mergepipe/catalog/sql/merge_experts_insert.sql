INSERT INTO merge_experts (merge_id, position, model, weight, density, planned_bytes, fallback)
SELECT :merge_id, unnest(:positions), unnest(:models), unnest(:weights), unnest(:densities),
       unnest(:planned_bytes), unnest(:fallbacks)
