"""The HTTP API (FastAPI): ingestion and merge jobs, manifests, lineage, read-only SQL."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import service` would load a second copy.
if __name__ != "mergepipe.service":
    raise ImportError(f"import mergepipe.service, not {__name__}: one module, one name")
