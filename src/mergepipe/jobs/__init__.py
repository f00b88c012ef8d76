"""The job layer: a merge or an ingestion end to end (plan, execute, publish, record, register)."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import jobs` would load a second copy.
if __name__ != "mergepipe.jobs":
    raise ImportError(f"import mergepipe.jobs, not {__name__}: one module, one name")
