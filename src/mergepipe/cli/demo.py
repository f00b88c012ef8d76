"""The README's main job, end to end: generate a family, serve, ingest, merge on a budget, report."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mergepipe.cli.table import human_bytes, print_table

DEMO_EXPERTS = 4
DEMO_SIZE_MB = 48
BUDGETS = (1.0, 0.5, 0.2)  # the last one is the merge TOUCHED_SQL looks at
TOUCHED_SQL = """
SELECT t.model, count(*) AS blocks, sum(t.nbytes) AS bytes,
       round(100.0 * sum(t.nbytes) / any_value(m.tensor_bytes), 1) AS pct_of_expert
FROM touched_blocks t JOIN models m ON m.name = t.model
WHERE t.merge_id = (SELECT merge_id FROM merges WHERE output_name = 'ties-20'
                    AND status = 'succeeded')
GROUP BY t.model ORDER BY t.model
"""
LINEAGE_SQL = "SELECT child, parent, role, weight FROM lineage ORDER BY child, role, parent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    """A tiny JSON client for the service (standard library only)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path} -> {e.code}: {e.read().decode()}") from None

    def wait(self, path: str, done: tuple[str, ...] = ("ready", "succeeded"),
             timeout: float = 600) -> dict[str, Any]:
        t0 = time.monotonic()
        while True:
            obj = self.call("GET", path)
            if obj["status"] in done:
                return obj
            if obj["status"] == "failed":
                raise RuntimeError(f"{path} failed: {obj.get('error')}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{path} still {obj['status']} after {timeout:.0f}s")
            time.sleep(0.05)

    def merge(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/merges and wait for it: the merge, with its wall time (wall_s)."""
        t0 = time.perf_counter()
        m = self.wait(f"/v1/merges/{self.call('POST', '/v1/merges', body)['id']}")
        m["wall_s"] = time.perf_counter() - t0
        return m


def start_server(root: Path, port: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, MERGEPIPE_CATALOG=str(root / "catalog.duckdb"),
               MERGEPIPE_DATA_ROOTS=str(root / "family"),
               MERGEPIPE_OUTPUT_ROOT=str(root / "merges"), MERGEPIPE_WORKERS="2")
    env.pop("MERGEPIPE_API_TOKEN", None)
    log = open(root / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen([sys.executable, "-m", "mergepipe", "serve", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    api = Api(f"http://127.0.0.1:{port}")
    for _ in range(300):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {root / 'server.log'}")
        try:
            api.call("GET", "/healthz")
            return proc
        except (OSError, RuntimeError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not come up in 30 s")


def relative_l2(a_dir: Path, b_dir: Path) -> float:
    """||a - b|| / ||b|| over all tensors of two safetensors checkpoints (float32)."""
    from safetensors import safe_open
    num = den = 0.0
    for f in sorted(b_dir.glob("*.safetensors")):
        with safe_open(str(a_dir / f.name), "pt") as fa, safe_open(str(f), "pt") as fb:
            for k in fb.keys():  # noqa: SIM118 - safe_open has no __iter__
                ta, tb = fa.get_tensor(k).float(), fb.get_tensor(k).float()
                num += float((ta - tb).pow(2).sum())
                den += float(tb.pow(2).sum())
    return math.sqrt(num) / math.sqrt(den) if den else 0.0


def run_demo(root: Path) -> int:
    from mergepipe.cli.family import generate_family
    from mergepipe.storage.storage import drop_page_cache

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    say(f"1/5 generating a family: base + {DEMO_EXPERTS} experts x {DEMO_SIZE_MB} MB (bf16) "
        f"in {root / 'family'}")
    fam = generate_family(root / "family", experts=DEMO_EXPERTS, size_mb=DEMO_SIZE_MB, seed=0)
    port = free_port()
    say(f"2/5 starting `mergepipe serve` on 127.0.0.1:{port} (catalog {root / 'catalog.duckdb'})")
    proc = start_server(root, port)
    api = Api(f"http://127.0.0.1:{port}")
    try:
        say("3/5 registering the base and the experts through POST /v1/models")
        t0 = time.perf_counter()
        api.call("POST", "/v1/models", {"name": "base", "path": str(fam["base"]), "kind": "full"})
        api.wait("/v1/models/base")
        experts = [n for n in fam if n != "base"]
        for name in experts:
            api.call("POST", "/v1/models", {"name": name, "path": str(fam[name]), "kind": "full",
                                            "base": "base"})
        for name in experts:
            api.wait(f"/v1/models/{name}")
        say(f"    ingested {len(experts) + 1} checkpoints in {time.perf_counter() - t0:.1f} s")

        say("4/5 posting TIES merges (density 0.5) at budgets "
            + ", ".join(f"{b:.0%}" for b in BUDGETS) + " through POST /v1/merges")
        results = []
        for b in BUDGETS:
            body = {"base": "base", "experts": [{"model": n} for n in experts],
                    "operator": "ties", "params": {"density": 0.5}, "budget": {"fraction": b},
                    "seed": 0, "output": {"name": f"ties-{int(b * 100)}"}}
            os.sync()  # cold reads: dirty pages cannot be evicted
            drop_page_cache(str(f) for f in (root / "family").rglob("*") if f.is_file())
            results.append(api.merge(body))
        full_out = root / "merges" / "ties-100"
        rows = []
        for b, m in zip(BUDGETS, results, strict=True):
            out = root / "merges" / f"ties-{int(b * 100)}"
            rows.append([f"{b:.0%}", human_bytes(m["expert_bytes_read"]),
                         human_bytes(m["full_read_bytes"]),
                         f"{m['expert_bytes_read'] / max(m['full_read_bytes'], 1):.1%}",
                         f"{m['wall_s']:.2f}", f"{relative_l2(out, full_out):.2e}"])
        print_table(["budget", "expert bytes read", "full read", "read/full", "wall s (cold)",
                     "rel. L2 dev. from 100%"], rows)
        say(f"5/5 what the {BUDGETS[-1]:.0%} merge touched, and the lineage, via POST /v1/sql")
        q = api.call("POST", "/v1/sql", {"sql": TOUCHED_SQL})
        print_table(q["columns"], q["rows"])
        q = api.call("POST", "/v1/sql", {"sql": LINEAGE_SQL})
        print_table(q["columns"], q["rows"])
        show_incremental(api, experts)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    say(closing_hint(root))
    return 0


# The closing hint's query: one short line per merge (SELECT * prints every plan and request
# JSON, hundreds of kilobytes for the demo's merges).
HINT_SQL = ("SELECT output_name, operator, strategy, expert_bytes_read, full_read_bytes "
            "FROM merges ORDER BY created_at")


def closing_hint(root: Path) -> str:
    catalog = root / "catalog.duckdb"
    return (f"outputs (merged checkpoints with manifest.json) are in {root / 'merges'}; the "
            f"catalog is {catalog} (try: mergepipe --catalog {shlex.quote(str(catalog))} sql "
            f"{shlex.quote(HINT_SQL)})")


def show_incremental(api: Api, experts: list[str]) -> None:
    """Linear merges of K-1 then K experts, from scratch and incrementally: the bytes each way."""
    k = len(experts)
    say(f"and incrementally: a linear merge of {k - 1} experts, then of {k} two ways")
    rows = []
    for names, strategy, output in ((experts[:-1], "scratch", f"linear-{k - 1}"),
                                    (experts, "scratch", f"linear-{k}-scratch"),
                                    (experts, "auto", f"linear-{k}-auto")):
        m = api.merge({"base": "base", "experts": [{"model": n} for n in names],
                       "operator": "linear", "strategy": strategy, "output": {"name": output}})
        rows.append([output, strategy, m["strategy"], m["previous_merge"] or "",
                     human_bytes(m["expert_bytes_read"]), f"{m['wall_s']:.2f}"])
    print_table(["output", "asked", "strategy", "reused merge", "expert bytes read", "wall s"],
                rows)


def say(msg: str) -> None:
    print(msg, flush=True)
