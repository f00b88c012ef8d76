-- PostgreSQL: migrations of several servers starting at once on one catalog run one at a time.
SELECT pg_advisory_xact_lock(7305218116)
