"""The bytes the merge PROCESS reads from expert files, counted by strace, stay within budget."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

STRACE = shutil.which("strace") or "/usr/bin/strace"
READ_CALLS = "pread64,preadv,preadv2,read,readv"
_CALL = re.compile(r"^(\d+)\s+(?:pread64|preadv2?|readv?)\((\d+)<([^>]*)>(.*)$")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (?:pread64|preadv2?|readv?) resumed>(.*)$")
_RESULT = re.compile(r"\)\s+=\s+(\d+)\s*$")


def expert_bytes_from_trace(trace: str, roots: list[Path]) -> dict[str, int]:
    """Bytes returned by read calls on files under `roots`, per file (strace -f -y output)."""
    prefixes = tuple(str(r.resolve()) + os.sep for r in roots)
    pending: dict[str, str] = {}  # pid -> path of an unfinished call
    out: dict[str, int] = {}
    for line in trace.splitlines():
        path, rest = None, ""
        if m := _CALL.match(line):
            pid, path, rest = m.group(1), m.group(3), m.group(4)
            if "<unfinished ...>" in rest:
                pending[pid] = path
                continue
        elif m := _RESUMED.match(line):
            path, rest = pending.pop(m.group(1), None), m.group(2)
        if path is None or not path.startswith(prefixes):
            continue
        if r := _RESULT.search(rest):
            out[path] = out.get(path, 0) + int(r.group(1))
    return out


def test_trace_parser_handles_unfinished_calls(tmp_path: Path) -> None:
    f = tmp_path / "e0" / "model.safetensors"
    trace = "\n".join([
        f'101 pread64(5<{f}>, ""..., 256, 1024) = 256',
        f"102 pread64(6<{f}>,  <unfinished ...>",
        '101 read(3</usr/lib/x.so>, ""..., 832) = 832',
        '102 <... pread64 resumed>""..., 512, 4096) = 512',
        f'103 preadv(7<{f}>, [{{iov_base=""..., iov_len=64}}], 1, 0) = 64',
    ])
    assert expert_bytes_from_trace(trace, [tmp_path / "e0"]) == {str(f): 256 + 512 + 64}


@pytest.mark.slow  # a traced child process: ~15 s, mostly importing torch under strace
@pytest.mark.skipif(not os.path.exists(STRACE), reason="strace is not installed; install it "
                    "(apt-get install strace) to count the bytes the process reads")
def test_process_reads_no_more_expert_bytes_than_the_budget(tmp_path: Path) -> None:
    db = new_catalog(tmp_path)
    cat = Catalog(db)
    paths = ingest_family(cat, tmp_path / "fam", shards=2)
    cat.close()
    trace = tmp_path / "trace.txt"
    cmd = [STRACE, "-f", "--seccomp-bpf", "-qq", "-s", "0", "-y", "-e", f"trace={READ_CALLS}", "-e",
           "signal=none", "-o", str(trace), sys.executable, "-m", "mergepipe", "--catalog",
           str(db), "merge", "--base", "base", "--experts",
           "e0,e1:0.5,e2", "--op", "ties", "--param", "density=0.5", "--budget", "0.3",
           "--out", str(tmp_path / "out"), "--json"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0 and "ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    seen = expert_bytes_from_trace(trace.read_text(), [paths[f"e{i}"] for i in range(3)])
    assert seen, "no expert read was traced"
    total = sum(seen.values())
    assert total <= result["budget_bytes"] < result["full_read_bytes"]
    assert total == result["expert_bytes_read"]  # our counter is the truth, byte for byte
