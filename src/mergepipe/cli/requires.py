"""Optional packages a command needs (the benchmarks' mergekit, the fidelity study's
transformers): checked before any work, so that their absence is one line, not a traceback
minutes into a run."""

from __future__ import annotations

import importlib.util

from mergepipe.core.errors import InvalidRequest


class MissingPackage(InvalidRequest):
    """A command needs a Python package that is not installed."""

    code = "missing_package"


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a hidden or broken package
        return False


def require(packages: dict[str, str], why: str) -> None:
    """Raise MissingPackage naming the first of `packages` (name -> how to install it) that is
    not installed; `why` says what the command needs it for."""
    for package, install in packages.items():
        if not installed(package):
            raise MissingPackage(f"needs the Python package {package!r} ({why}), which is not "
                                 f"installed: {install}", field=package)


def missing_module(e: ModuleNotFoundError) -> MissingPackage | None:
    """A third-party module that a command imported but is not installed (a dependency not
    checked ahead); None for a module of mergepipe's own (a bug, shown as one)."""
    top = (e.name or "").split(".")[0]
    if not top or top == "mergepipe":
        return None
    return MissingPackage(f"a Python package this command needs is not installed: {top!r} "
                          f"(pip install {top})", field=top)
