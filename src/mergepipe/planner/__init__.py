"""Access planner: which expert blocks a merge reads under an I/O budget (SQL over the catalog)."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import planner` would load a second copy.
if __name__ != "mergepipe.planner":
    raise ImportError(f"import mergepipe.planner, not {__name__}: one module, one name")
