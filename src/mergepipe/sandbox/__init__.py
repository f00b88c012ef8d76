"""The user-SQL sandbox: one read-only SELECT over the catalog under engine-enforced limits."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import sandbox` would load a second copy.
if __name__ != "mergepipe.sandbox":
    raise ImportError(f"import mergepipe.sandbox, not {__name__}: one module, one name")
