-- The models users see: the latest version of each name that is not retired; bases first, then
-- each base's experts, by name.
SELECT * FROM models m
WHERE m.retired_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM models v
                  WHERE coalesce(v.family, v.name) = coalesce(m.family, m.name)
                    AND v.retired_at IS NULL AND v.version > m.version)
ORDER BY coalesce(m.base, m.name), m.base IS NOT NULL, m.name
