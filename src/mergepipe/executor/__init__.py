"""Streaming executor: reads the planned expert blocks, merges block by block, publishes atomically."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import executor` would load a second copy.
if __name__ != "mergepipe.executor":
    raise ImportError(f"import mergepipe.executor, not {__name__}: one module, one name")
