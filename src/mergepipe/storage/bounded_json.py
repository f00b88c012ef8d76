"""JSON of checkpoint files with integers bounded: a clear error, not Python's digit limit."""

from __future__ import annotations

import json
from typing import Any

MAX_INT_DIGITS = 40  # safetensors offsets need 20 (2^64); configs' ids and sizes fewer


class IntegerTooLong(ValueError):
    """A JSON integer with more than MAX_INT_DIGITS digits."""


def _int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise IntegerTooLong(f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are read)")
    return int(text)


def loads(data: str | bytes) -> Any:
    """json.loads with integers bounded (IntegerTooLong)."""
    return json.loads(data, parse_int=_int)
