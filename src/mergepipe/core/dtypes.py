"""The tensor dtypes MergePipe reads and writes, by safetensors name."""

from __future__ import annotations

from mergepipe.core.errors import InvalidRequest

DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2}  # bytes per element
DTYPE_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16",
               "fp32": "F32", "fp16": "F16", "bf16": "BF16",
               "F32": "F32", "F16": "F16", "BF16": "BF16"}
HF_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # config.json names


def normalize_dtype(name: str, field: str = "dtype") -> str:
    """'bfloat16' / 'bf16' / 'BF16' / 'torch.bfloat16' -> 'BF16'; refuses what we cannot merge."""
    key = str(name).removeprefix("torch.")
    if key not in DTYPE_NAMES:
        raise InvalidRequest(f"unsupported dtype {str(name)[:40]!r} (use float32, float16 or "
                             "bfloat16)", field=field)
    return DTYPE_NAMES[key]
