-- The migrations table exists (a new catalog has none), asked the same way on both engines.
SELECT 1 FROM information_schema.tables
WHERE table_name = 'schema_migrations' AND table_schema = current_schema()
