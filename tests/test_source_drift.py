"""Source drift: a checkpoint changed on disk after its ingestion (same size and mtime but other
bytes in a block the plan reads, another size, a touched mtime, deleted; an expert or the base)
fails the merge with an error that says to re-ingest, through the API and the CLI; nothing is
published and re-ingesting makes the merge work again."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mergepipe.cli.main import main
from tests.api_helpers import client_for, make_family, register_family, settings_for, wait
from tests.catalogs import new_catalog


def _flip_block_keep_mtime(f: Path) -> None:
    """Other bytes in the last tensor's data, same size, mtime put back: the lowest mantissa bit
    of its last 32 bf16 values (another version of a fine-tune, still near its base: ingestion
    refuses an expert far from its base)."""
    st = f.stat()
    data = bytearray(f.read_bytes())
    for i in range(2, 65, 2):
        data[-i] ^= 0x01
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def _grow(f: Path) -> None:
    with f.open("ab") as fh:
        fh.write(b"\0" * 8)


def _flip_and_touch(f: Path) -> None:
    """Other bytes and a new mtime (a touch alone, same bytes, is re-verified by content hash
    and accepted: tests/test_lifecycle.py)."""
    st = f.stat()
    _flip_block_keep_mtime(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _delete(f: Path) -> None:
    f.unlink()


CHANGES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "bytes": (_flip_block_keep_mtime, ("content hash",)),
    "size": (_grow, ("changed after ingestion", "size")),
    "mtime": (_flip_and_touch, ("changed after ingestion", "mtime", "content hash")),
    "deleted": (_delete, ("not readable",)),
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp: Path = tmp_path_factory.mktemp("drift")
    family = make_family(tmp / "data" / "family")
    settings = settings_for(tmp)
    with client_for(settings) as c:
        register_family(c, family)
        yield {"tmp": tmp, "client": c, "family": family, "settings": settings}


def _register(c: Any, name: str, path: Path, base: str | None = None) -> None:
    body: dict[str, Any] = {"name": name, "path": str(path)}
    if base:
        body["base"] = base
    r = c.post("/v1/models", json=body)
    assert r.status_code == 202, r.text
    assert wait(c, f"/v1/models/{name}")["status"] == "ready"


def _merge(c: Any, base: str, experts: list[str], out: str) -> dict[str, Any]:
    r = c.post("/v1/merges", json={"base": base, "experts": [{"model": e} for e in experts],
                                   "operator": "task_arithmetic", "budget": {"fraction": 1.0},
                                   "output": {"name": out}})
    assert r.status_code == 202, r.text
    return wait(c, f"/v1/merges/{r.json()['id']}")


@pytest.mark.parametrize("which", ["expert", "base"])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_changed_checkpoint_fails_the_merge_and_publishes_nothing(
        env: dict[str, Any], change: str, which: str) -> None:
    c, data, fam = env["client"], env["tmp"] / "data", env["family"]
    tag = f"{which}-{change}"
    base_dir, expert_dir = data / f"b-{tag}", data / f"x-{tag}"
    shutil.copytree(fam["base"], base_dir)
    shutil.copytree(fam["e1"], expert_dir)
    _register(c, f"b-{tag}", base_dir)
    _register(c, f"x-{tag}", expert_dir, base=f"b-{tag}")
    ok = _merge(c, f"b-{tag}", [f"x-{tag}"], f"before-{tag}")
    assert ok["status"] == "succeeded", ok

    edit, words = CHANGES[change]
    victim = (base_dir if which == "base" else expert_dir) / "model.safetensors"
    edit(victim)
    m = _merge(c, f"b-{tag}", [f"x-{tag}"], f"after-{tag}")
    assert m["status"] == "failed", m
    name = f"b-{tag}" if which == "base" else f"x-{tag}"
    for w in (*words, f"'{name}'", "re-ingest"):
        assert w in m["error"], (w, m["error"])
    out = env["settings"].output_root
    assert not (out / f"after-{tag}").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    assert c.get(f"/v1/models/after-{tag}").status_code == 404

    if change == "deleted":
        shutil.copy(fam["base" if which == "base" else "e1"] / "model.safetensors", victim)
    if change == "size":  # trailing bytes: no longer a safetensors file (ingestion refuses it)
        os.truncate(victim, victim.stat().st_size - 8)
    # re-ingesting (under a new name: the old one keeps its lineage) makes it mergeable again
    if which == "expert":
        _register(c, f"x2-{tag}", expert_dir, base=f"b-{tag}")
        again = _merge(c, f"b-{tag}", [f"x2-{tag}"], f"again-{tag}")
        assert again["status"] == "succeeded", again


def test_a_changed_expert_through_the_cli(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    fam = make_family(tmp_path / "fam")
    db = str(new_catalog(tmp_path))
    assert main(["--catalog", db, "ingest", str(fam["base"]), "--name", "base"]) == 0
    assert main(["--catalog", db, "ingest", str(fam["e1"]), "--name", "e1", "--base",
                 "base"]) == 0
    _flip_block_keep_mtime(fam["e1"] / "model.safetensors")  # (e0 has a zero delta there: never read)
    capsys.readouterr()
    rc = main(["--catalog", db, "merge", "--base", "base", "--experts", "e1", "--op", "linear",
               "--budget", "1", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    assert "'e1'" in err and "re-ingest" in err and "content hash" in err, err
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
