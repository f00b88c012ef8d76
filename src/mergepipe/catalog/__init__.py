"""Catalog: the database (rows, migrations, ingestion, statistics, the job queue)."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import catalog` would load a second copy.
if __name__ != "mergepipe.catalog":
    raise ImportError(f"import mergepipe.catalog, not {__name__}: one module, one name")
