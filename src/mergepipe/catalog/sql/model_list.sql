-- Every model: bases first, then each base's experts, by name.
SELECT * FROM models ORDER BY coalesce(base, name), base IS NOT NULL, name
