"""Side files: copied by name from the model-directory allow-list, each under a size cap, holes
kept as holes; everything else in the base's directory is left out and listed in the manifest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.core.errors import Forbidden
from mergepipe.core.request import build_request
from mergepipe.executor.side_files import SIDE_FILES, copy_side_files
from mergepipe.jobs.merge import merge
from mergepipe.storage.fsconfine import confined
from tests.catalogs import new_catalog
from tests.executor_family import ingest_family

MIB = 1 << 20


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    """A file of `size` bytes of which only `head` is data: the rest is a hole."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def _allocated(d: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in d.iterdir() if p.is_file())


def test_sparse_and_unlisted_side_files_are_not_written_densely(tmp_path: Path) -> None:
    cat = Catalog(new_catalog(tmp_path))
    try:
        paths = ingest_family(cat, tmp_path / "fam", block_bytes=2048)
        base = paths["base"]
        (base / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
        for n in ("a.bin", "b.dat", "c.txt"):  # three sparse 100 MiB files, 0 bytes allocated
            _sparse(base / n, 100 * MIB)
        _sparse(base / "vocab.json", 30 * MIB, b'{"a": 1}')  # allowed, under its cap: holes kept
        cap = SIDE_FILES["tokenizer_config.json"]
        _sparse(base / "tokenizer_config.json", cap + 1)  # allowed name, over its cap
        os.mkfifo(base / "merges.txt")  # allowed name, not a regular file: never opened blocking
        req = build_request(base="base", experts="e0,e1", operator="linear", budget=0.5,
                            output_dtype="F16")
        merge(cat, req, tmp_path / "out", output_name="side")
        out = tmp_path / "out"
        assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
        assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
        assert os.path.getsize(out / "vocab.json") == 30 * MIB
        with open(out / "vocab.json", "rb") as f:
            assert f.read(8) == b'{"a": 1}' and f.read(1 << 16) == bytes(1 << 16)
        assert (out / "vocab.json").stat().st_blocks * 512 < MIB  # the hole stayed a hole
        for n in ("a.bin", "b.dat", "c.txt", "tokenizer_config.json", "merges.txt"):
            assert not (out / n).exists(), n
        weights = sum(os.path.getsize(p) for p in out.glob("*.safetensors"))
        assert _allocated(out) < weights + 2 * MIB
        manifest = json.loads((out / "manifest.json").read_text())["output"]
        assert sorted(manifest["extra_files"]) == ["config.json", "tokenizer.json", "vocab.json"]
        reasons = {f["name"]: f["reason"] for f in manifest["left_out_files"]}
        assert sorted(reasons) == ["a.bin", "b.dat", "c.txt", "tokenizer_config.json"]
        assert "not a model-directory side file" in reasons["a.bin"]
        assert reasons["tokenizer_config.json"] == (f"{cap + 1} bytes, over the {cap}-byte cap "
                                                    "for this file")
    finally:
        cat.close()


def test_side_files_are_opened_beneath_the_data_root(tmp_path: Path) -> None:
    root, outside, out = tmp_path / "root", tmp_path / "outside", tmp_path / "out"
    for d in (root, outside, out):
        d.mkdir()
    (outside / "secret").write_text("secret")
    (root / "tokenizer.json").symlink_to(outside / "secret")
    with confined([root]), pytest.raises(Forbidden):
        copy_side_files([str(root / "tokenizer.json")], out, None)
    assert list(out.iterdir()) == []
