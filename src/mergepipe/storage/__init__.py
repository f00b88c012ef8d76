"""Storage: stores, range readers, confinement and the safetensors format, below the catalog."""

# One name per module: the repository root links service/, planner/, executor/ and migrations/
# into this tree, so with the root on sys.path `import storage` would load a second copy.
if __name__ != "mergepipe.storage":
    raise ImportError(f"import mergepipe.storage, not {__name__}: one module, one name")
