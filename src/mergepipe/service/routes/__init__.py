"""One router per resource: models, plans, merges, lineage, sql, health."""
