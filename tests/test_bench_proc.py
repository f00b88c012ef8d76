"""The benchmarks' child-process probe: a child's peak RSS is its own, whatever its parent's."""

from __future__ import annotations

import sys

from mergepipe_bench.proc import run_timed

MIB = 2**20


def _child(mib: int) -> list[str]:
    code = f"import time; x = bytearray({mib} * 2**20); time.sleep(0.2)"
    return [sys.executable, "-c", code]


def test_peak_rss_is_the_childs_own_not_its_large_parents() -> None:
    ballast = bytearray(400 * MIB)  # zero pages are not resident until written
    ballast[::4096] = b"\x01" * len(ballast[::4096])
    small, large = run_timed(_child(20)).check(), run_timed(_child(150)).check()
    assert small.peak_rss < 120 * MIB  # wait4's ru_maxrss gave the parent's 400+ MiB here
    assert large.peak_rss >= 150 * MIB
    assert large.peak_rss - small.peak_rss >= 110 * MIB
    del ballast
