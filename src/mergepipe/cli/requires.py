"""Optional packages a command needs, checked before any work: one line, not a late traceback."""

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
    """MissingPackage for the first of `packages` (name -> how to install) not installed."""
    for package, install in packages.items():
        if not installed(package):
            raise MissingPackage(f"needs the Python package {package!r} ({why}), which is not "
                                 f"installed: {install}", field=package)


def missing_module(e: ModuleNotFoundError) -> MissingPackage | None:
    """A missing third-party module as MissingPackage; None for one of mergepipe's own (a bug)."""
    top = (e.name or "").split(".")[0]
    if not top or top == "mergepipe":
        return None
    return MissingPackage(f"a Python package this command needs is not installed: {top!r} "
                          f"(pip install {top})", field=top)
