"""Numbered catalog migrations (NNNN_name.sql) and catalog_schema.sql, applied by mergepipe.catalog.db."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import migrations` would load a second copy.
if __name__ != "mergepipe.migrations":
    raise ImportError(f"import mergepipe.migrations, not {__name__}: one module, one name")
