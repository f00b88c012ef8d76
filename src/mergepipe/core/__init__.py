"""The core: errors, request model, operator specs and settings; imports nothing of ours."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import core` would load a second copy.
if __name__ != "mergepipe.core":
    raise ImportError(f"import mergepipe.core, not {__name__}: one module, one name")
