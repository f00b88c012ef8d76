-- The models users see: the latest version of each name that is not retired; bases first, then
-- each base's experts, by name.
SELECT * FROM models m
WHERE m.retired_at IS NULL
  AND m.version = (SELECT max(v.version) FROM models v
                   WHERE v.family = m.family AND v.retired_at IS NULL)
ORDER BY coalesce(m.base, m.name), m.base IS NOT NULL, m.name
