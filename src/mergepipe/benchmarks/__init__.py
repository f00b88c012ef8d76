"""Benchmarks: the checkpoint family generator and the benchmark suite."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import benchmarks` would load a second copy.
if __name__ != "mergepipe.benchmarks":
    raise ImportError(f"import mergepipe.benchmarks, not {__name__}: one module, one name")
