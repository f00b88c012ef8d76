"""Synthetic byte-level corpora: a generic pretraining text and four per-token task languages.

A task line is a prefix naming the task, then PAIRS pairs (x, f(x)) written side by side, then a
newline: "S:" "a" "b" "q" "r" ... The answer tokens are the f(x); each depends on the token just
before it through the task's map f, so a tiny model learns it in a few hundred CPU steps. The
tasks read disjoint input alphabets (lower case, upper case, digits, brackets), so the experts
are complementary, as in the usual merge of skills; with a shared alphabet (an earlier version
mapped lower case three ways) the merge is an arbitrary compromise between conflicting maps. Tasks
that need attention to distant positions (copy, reverse, sort) do not train in that time on two
busy cores: the base did not learn to copy in 300 steps and a reverse expert stayed at 0% exact
match after 250 steps, so they are not used.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

BOS = 256  # byte-level vocabulary: 0..255 are bytes, then BOS and PAD
PAD = 257
VOCAB_SIZE = 260  # two spare ids keep the embedding rows a multiple of 4
END = ord("\n")
PAIRS = 6  # (x, f(x)) pairs per task line


@dataclass(frozen=True)
class Example:
    """One task line: its text and the indexes (in ids()) of its answer tokens f(x)."""

    task: str
    text: str
    answers: tuple[int, ...]

    def ids(self) -> list[int]:
        return [BOS, *self.text.encode()]


def _cipher_map() -> dict[str, str]:
    perm = list(string.ascii_uppercase)
    random.Random("cipher-map").shuffle(perm)
    return dict(zip(string.ascii_uppercase, perm, strict=True))


_CIPHER = _cipher_map()
_CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}
MAPS: dict[str, tuple[str, str, Callable[[str], str]]] = {  # task -> (prefix, inputs, f)
    "shift": ("S:", string.ascii_lowercase, lambda c: chr((ord(c) - 97 + 1) % 26 + 97)),
    "cipher": ("C:", string.ascii_uppercase, lambda c: _CIPHER[c]),
    "modadd": ("M:", string.digits, lambda c: str((int(c) + 3) % 10)),
    "brackets": ("B:", "([{<", lambda c: _CLOSE[c]),
}
TASKS = tuple(MAPS)


def make_example(task: str, rng: random.Random) -> Example:
    """A random line of `task`: PAIRS inputs drawn uniformly, each followed by its image."""
    prefix, inputs, f = MAPS[task]
    xs = [rng.choice(inputs) for _ in range(PAIRS)]
    text = prefix + "".join(x + f(x) for x in xs) + "\n"
    first = 1 + len(prefix) + 1  # BOS, prefix, first x
    return Example(task, text, tuple(first + 2 * i for i in range(PAIRS)))


def task_examples(task: str, n: int, seed: int, exclude: set[str] | None = None) -> list[Example]:
    """n examples of one task from a generator seeded by (task, seed), none with a text in
    `exclude` (the eval set stays held out)."""
    rng = random.Random(f"{task}:{seed}")
    out: list[Example] = []
    while len(out) < n:
        e = make_example(task, rng)
        if not exclude or e.text not in exclude:
            out.append(e)
    return out


def eval_set(tasks: list[str], per_task: int, seed: int) -> list[Example]:
    """Held-out examples (a seed disjoint from the training seeds), per_task of each task."""
    return [e for t in tasks for e in task_examples(t, per_task, 10_000 + seed)]


def pretrain_line(rng: random.Random) -> str:
    """A generic line: words, numbers, or a repeated segment."""
    kind = rng.random()
    if kind < 0.4:
        words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 6)))
                 for _ in range(rng.randint(2, 6))]
        return " ".join(words) + "\n"
    if kind < 0.6:
        return " ".join("".join(rng.choice(string.digits) for _ in range(rng.randint(1, 6)))
                        for _ in range(rng.randint(2, 5))) + "\n"
    chars = string.ascii_lowercase if rng.random() < 0.5 else string.digits
    s = "".join(rng.choice(chars) for _ in range(rng.randint(3, 8)))
    return f"{s}{rng.choice([' ', '=', ':', '|'])}{s}\n"


def pretrain_ids(n_lines: int, seed: int) -> list[list[int]]:
    """Token ids of n_lines generic pretraining lines."""
    rng = random.Random(f"pretrain:{seed}")
    return [[BOS, *pretrain_line(rng).encode()] for _ in range(n_lines)]
