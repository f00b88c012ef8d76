"""The command line: one entry point, thin over the job layer."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import cli` would load a second copy.
if __name__ != "mergepipe.cli":
    raise ImportError(f"import mergepipe.cli, not {__name__}: one module, one name")
