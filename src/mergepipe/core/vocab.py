"""The words every entry point shares: tensor dtypes and their spellings, model names, checkpoint
kinds and merge strategies (no third-party import: the CLI's parser reads it at start-up)."""

from __future__ import annotations

import re

from mergepipe.core.errors import InvalidRequest

# -- dtypes, by safetensors name ----------------------------------------------------------------
DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2}  # bytes per element
HF_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}  # config.json, torch
# every spelling a request, a CLI option or a mergekit config may use
DTYPE_NAMES = {**{n: n for n in DTYPE_SIZES}, **{v: k for k, v in HF_DTYPE_NAMES.items()},
               "fp32": "F32", "fp16": "F16", "bf16": "BF16"}
DTYPE_HELP = "float32, float16 or bfloat16 (or F32, F16, BF16, fp32, fp16, bf16)"


def dtype_name(name: object) -> str:
    """'bfloat16' / 'bf16' / 'BF16' / 'torch.bfloat16' -> 'BF16'; ValueError for what we cannot
    merge."""
    key = name.removeprefix("torch.") if isinstance(name, str) else None
    if key not in DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {str(name)[:40]!r} (use {DTYPE_HELP})")
    return DTYPE_NAMES[key]


def normalize_dtype(name: object, field: str = "dtype") -> str:
    """dtype_name, refusing with InvalidRequest naming `field`."""
    try:
        return dtype_name(name)
    except ValueError as e:
        raise InvalidRequest(f"{field}: {e}", field=field) from None


# -- names --------------------------------------------------------------------------------------
# Model and output names: catalog keys and directory names under the output root (one path
# segment). Matched whole (fullmatch): with `$`, "e0\n" was a valid name.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._+@-]{0,127}"
NAME_RULE = "1-128 of A-Z a-z 0-9 . _ - + @, starting with a letter or digit, no '..'"
_NAME = re.compile(NAME_PATTERN)


def name_problem(name: object) -> str | None:
    """Why `name` is not a valid model or output name (None: it is)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        return f"{_quoted(name)} is not a valid name ({NAME_RULE})"
    return None


def check_name(name: object, field: str) -> str:
    """`name` if it is a valid model / output name, else InvalidRequest naming `field`."""
    why = name_problem(name)
    if why is not None:
        raise InvalidRequest(f"{field} {why}", field=field)
    assert isinstance(name, str)
    return name


def _quoted(v: object) -> str:
    r = repr(v) if not isinstance(v, int) or v.bit_length() < 128 else "a very large integer"
    return r if len(r) <= 40 else r[:37] + "..."


def share_problem(v: float) -> str | None:
    """Why `v` is not a share (a density, a budget fraction): it must lie in (0, 1]."""
    return None if 0 < v <= 1 else f"{v:g} is outside (0, 1]"


# -- checkpoints and merges ---------------------------------------------------------------------
KINDS = ("full", "delta", "lora")  # how a model stores its weights
# A queued ingestion of a config's URL: "lora" if the directory holds adapter_config.json, else
# "full", decided by the job (a request thread never waits on the network to find out).
AUTO = "auto"
MIN_BLOCK_BYTES = 64
MAX_BLOCK_BYTES = 64 << 20  # a merge holds about K x block size; 1 GiB blocks were accepted
# How a merge is computed (docs/incremental.md). The default, scratch, never depends on which
# merges the catalog holds; incremental and auto reuse a stored merge only when asked.
STRATEGIES = ("scratch", "incremental", "auto")
DEFAULT_STRATEGY = "scratch"
