"""Synthetic byte-level corpora: a generic pretraining text and four task languages."""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

BOS = 256  # byte-level vocabulary: 0..255 are bytes, then BOS and PAD
PAD = 257
VOCAB_SIZE = 260  # two spare ids keep the embedding rows a multiple of 4
END = ord("\n")  # every answer ends with a newline: greedy decoding must stop there


@dataclass(frozen=True)
class Example:
    """One task line: the prompt (up to and including '='), and the answer (with the newline)."""

    task: str
    prompt: str
    answer: str

    def ids(self) -> list[int]:
        return [BOS, *(self.prompt + self.answer).encode()]

    @property
    def answer_start(self) -> int:
        """Index in ids() of the first answer token."""
        return 1 + len(self.prompt.encode())


def _letters(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.digits) for _ in range(n))


def _reverse(rng: random.Random) -> Example:
    s = _letters(rng, 3, 8)
    return Example("reverse", f"R:{s}=", s[::-1] + "\n")


def _sort(rng: random.Random) -> Example:
    s = _digits(rng, rng.randint(3, 8))
    return Example("sort", f"S:{s}=", "".join(sorted(s)) + "\n")


def _shift(rng: random.Random) -> Example:
    s = _letters(rng, 3, 8)
    out = "".join(chr((ord(c) - 97 + 1) % 26 + 97) for c in s)
    return Example("shift", f"C:{s}=", out + "\n")


def _modadd(rng: random.Random) -> Example:
    n = rng.randint(3, 6)
    a, b = _digits(rng, n), _digits(rng, n)
    out = "".join(str((int(x) + int(y)) % 10) for x, y in zip(a, b, strict=True))
    return Example("modadd", f"M:{a}+{b}=", out + "\n")


TASKS: dict[str, Callable[[random.Random], Example]] = {
    "reverse": _reverse, "sort": _sort, "shift": _shift, "modadd": _modadd,
}


def task_examples(task: str, n: int, seed: int) -> list[Example]:
    """n examples of one task from a generator seeded by (task, seed)."""
    rng = random.Random(f"{task}:{seed}")
    return [TASKS[task](rng) for _ in range(n)]


def eval_set(tasks: list[str], per_task: int, seed: int) -> list[Example]:
    """Held-out examples (a seed disjoint from the training seeds), per_task of each task."""
    return [e for t in tasks for e in task_examples(t, per_task, 10_000 + seed)]


def pretrain_line(rng: random.Random) -> str:
    """A generic line: words, numbers, or a repeated segment (teaches copying/induction)."""
    kind = rng.random()
    if kind < 0.4:
        words = [_letters(rng, 1, 6) for _ in range(rng.randint(2, 6))]
        return " ".join(words) + "\n"
    if kind < 0.6:
        return " ".join(_digits(rng, rng.randint(1, 6)) for _ in range(rng.randint(2, 5))) + "\n"
    s = _letters(rng, 3, 8) if rng.random() < 0.5 else _digits(rng, rng.randint(3, 8))
    sep = rng.choice([" ", "=", ":", "|"])
    return f"{s}{sep}{s}\n"


def pretrain_ids(n_lines: int, seed: int) -> list[list[int]]:
    """Token ids of n_lines generic pretraining lines."""
    rng = random.Random(f"pretrain:{seed}")
    return [[BOS, *pretrain_line(rng).encode()] for _ in range(n_lines)]
