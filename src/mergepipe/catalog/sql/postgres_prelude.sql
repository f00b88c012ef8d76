-- PostgreSQL: the DuckDB functions the planner's SQL uses, created with the schema.
-- DuckDB's len(list): the number of elements
CREATE OR REPLACE FUNCTION len(anyarray) RETURNS integer LANGUAGE sql IMMUTABLE
    AS 'SELECT cardinality($1)';
-- DuckDB's sha256(varchar): lowercase hex of the UTF-8 bytes' digest
CREATE OR REPLACE FUNCTION sha256(text) RETURNS text LANGUAGE sql IMMUTABLE
    AS 'SELECT encode(sha256(convert_to($1, ''UTF8'')), ''hex'')';
