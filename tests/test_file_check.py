"""The file check before a merge reads: a changed input file is never merged as if unchanged.

The executor loads only the planned blocks of each expert (issue 31); a file whose stamp
changed is still re-verified against every block the catalog has of it, read or not."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from mergepipe.catalog.db import Catalog
from mergepipe.catalog.models import model_blocks, model_files
from mergepipe.core.errors import SourceChanged
from mergepipe.core.request import build_request
from mergepipe.jobs.merge import merge
from mergepipe.jobs.planning import check_inputs
from mergepipe.planner.plan import make_plan
from tests.executor_family import ingest_family

EXPERTS = "e0,e1:0.5,e2"


def _unplanned_block(cat: Catalog, budget: float, model: str) -> tuple[Path, int, str, int]:
    """(file, byte offset, tensor, block index) of a block of `model` the plan does not read."""
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=budget)
    read = make_plan(cat, check_inputs(cat, req)).selected()
    files = {f.index: Path(f.path) for f in model_files(cat, model)}
    for b in model_blocks(cat, model):
        if b.block_index not in read.get((model, b.tensor), set()):
            return files[b.file_index], b.byte_offset + b.nbytes // 2, b.tensor, b.block_index
    raise AssertionError(f"the plan at {budget} reads every block of {model}")


def test_a_size_preserving_change_to_an_unread_block_is_refused(catalog: Catalog,
                                                                tmp_path: Path) -> None:
    ingest_family(catalog, tmp_path / "fam")
    f, offset, tensor, index = _unplanned_block(catalog, 0.2, "e1")
    size = f.stat().st_size
    with open(f, "r+b") as fh:  # one byte flipped in place: same size, a new mtime
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert f.stat().st_size == size
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=0.2)
    with pytest.raises(SourceChanged, match=rf"model 'e1': file {f} changed after ingestion "
                       rf".*tensor '{tensor}' block {index} differs"):
        merge(catalog, req, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_touched_file_with_its_bytes_is_accepted_and_restamped(catalog: Catalog,
                                                                 tmp_path: Path) -> None:
    ingest_family(catalog, tmp_path / "fam")
    f, *_ = _unplanned_block(catalog, 0.2, "e2")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    req = build_request(base="base", experts=EXPERTS, operator="linear", budget=0.2)
    s = merge(catalog, req, tmp_path / "out")
    assert s.expert_bytes_read > 0
    (row,) = [r for r in model_files(catalog, "e2") if Path(r.path) == f]
    assert row.mtime_ns == st.st_mtime_ns + 10**9  # re-verified, the new stamp recorded
    # The manifest's digests still cover every block of each input, not only the planned ones.
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    for m in manifest["inputs"]:
        h = hashlib.sha256()
        for b in sorted(model_blocks(catalog, m["model"]), key=lambda b: (b.tensor, b.block_index)):
            h.update(f"{b.tensor}\0{b.block_index}\0{b.content_hash}\n".encode())
        assert m["blocks_digest"] == h.hexdigest(), m["model"]
