"""The C extension (mergepipe/core/_fused.c, built by setup.py at install) and its dtype codes;
`EXTENSION` is None where it was not built or MERGEPIPE_NO_FUSED is set (same bits in torch)."""

from __future__ import annotations

import os
from typing import Any

EXTENSION: Any
try:
    from mergepipe.core import _fused as EXTENSION  # type: ignore[attr-defined,no-redef]
except ImportError:
    EXTENSION = None
if os.environ.get("MERGEPIPE_NO_FUSED"):
    EXTENSION = None

# The kernels' codes of the safetensors float dtypes.
CODES = {"F32": 0, "F16": 1, "BF16": 2}
