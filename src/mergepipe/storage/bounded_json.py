"""JSON read from checkpoint files (safetensors headers, index and config files) with integers
bounded: a 5000-digit integer is refused with a clear error naming the file, instead of Python's
digit-limit ValueError surfacing as an internal error (or, in a base's config.json, failing every
later merge that rewrites it)."""

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
    """json.loads with integers bounded (IntegerTooLong); JSONDecodeError and RecursionError as
    json raises them."""
    return json.loads(data, parse_int=_int)
