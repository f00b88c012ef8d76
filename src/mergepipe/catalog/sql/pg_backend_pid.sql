-- PostgreSQL: the process id of this connection's server backend (a child of the postmaster)
SELECT pg_backend_pid()
