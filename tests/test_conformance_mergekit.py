"""End-to-end conformance at full budget with mergekit 0.1.5 (run as a subprocess), and DARE's
keyed randomness checked by its properties through the real catalog, planner and executor.

Tolerances (bf16 output, float32 compute as in the mergekit configs, `dtype: float32`):
* task_arithmetic and ties: bitwise equal. Both tools compute D_i = E_i - B in float32 and sum
  the K weighted deltas in request order (mergekit's torch.sum over 3 stacked experts adds them
  left to right; ours does explicitly), then divide, scale and add to B in the same order.
  TIES excludes the entries tied at an expert's trim threshold, where mergekit keeps an
  arbitrary subset (argsort) and we keep a keyed one.
* linear: within 1 bf16 ulp. mergekit computes sum(w_i E_i) / sum(w), we compute
  B + sum(w_i D_i) / sum(w); equal in exact arithmetic, a few float32 ulps apart, which can
  flip the final rounding to bf16 by one ulp at most.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests import factory
from tests.catalogs import new_catalog
from tests.operator_helpers import exact_trim

pytest.importorskip("mergekit", reason="mergekit (test extra: pip install -e '.[test]') is not "
                                       "installed; the conformance reference is missing")

from mergepipe.catalog.db import Catalog  # noqa: E402
from mergepipe.catalog.ingest import ingest_model  # noqa: E402
from mergepipe.catalog.models import model_blocks  # noqa: E402
from mergepipe.core.request import build_request  # noqa: E402
from mergepipe.jobs.merge import merge  # noqa: E402
from mergepipe.planner.plan import make_plan  # noqa: E402

EXPERTS = ("e0", "e1", "e2")
WEIGHTS = (1.0, 0.5, 2.0)
DENSITIES = (0.5, 0.3, 0.7)
BLOCK_BYTES = 512  # several blocks per matrix: the per-block path is what is compared
CASES: dict[str, dict[str, object]] = {  # operator -> global parameters, in both tools
    "linear": {"normalize": True},
    "task_arithmetic": {"normalize": False, "lambda": 0.6},
    "ties": {"normalize": True, "lambda": 1.0},
}
WITH_DENSITY = ("ties", "dare_linear", "dare_ties")


@pytest.fixture(scope="module")
def fam(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bf16 Llama base and 3 full experts: one with an untouched tensor, one sparse."""
    root = tmp_path_factory.mktemp("family")
    base = factory.save_checkpoint(root / "base", factory.random_weights(factory.LLAMA_SHAPES, 0),
                                   config=factory.LLAMA_CONFIG)
    out = {"base": base}
    for i, name in enumerate(EXPERTS):
        out[name] = factory.make_expert(
            base, root / name, seed=100 + i, zero_tensors=("model.norm.weight",) if i == 0 else (),
            sparsity=0.3 if i == 2 else 0.0)
        (out[name] / "config.json").write_text(json.dumps(factory.LLAMA_CONFIG))
    return out


@pytest.fixture(scope="module")
def cat(fam: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    c = Catalog(new_catalog(tmp_path_factory.mktemp("cat")))
    ingest_model(c, fam["base"], "base", block_bytes=BLOCK_BYTES)
    for name in EXPERTS:
        ingest_model(c, fam[name], name, base="base", block_bytes=BLOCK_BYTES)
    yield c
    c.close()


def _mergekit_config(op: str, fam: dict[str, Path]) -> dict:
    models = []
    for name, w, d in zip(EXPERTS, WEIGHTS, DENSITIES, strict=True):
        p: dict[str, float] = {"weight": w}
        if op in WITH_DENSITY:
            p["density"] = d
        models.append({"model": str(fam[name].absolute()), "parameters": p})
    cfg = {"merge_method": op, "models": models, "parameters": dict(CASES[op]),
           "dtype": "float32", "out_dtype": "bfloat16"}
    if op != "linear":  # mergekit's linear averages the listed models; the base is not one
        cfg["base_model"] = str(fam["base"].absolute())
    return cfg


# mergekit-yaml's own entry point (the console script calls exactly this click command), run
# for the three configs in one subprocess: one import of torch + transformers + mergekit
# instead of three, which is most of the cost on a small machine.
_RUN_MERGEKIT_YAML = """
import sys
from mergekit.scripts.run_yaml import main
for cfg, out in zip(sys.argv[1::2], sys.argv[2::2]):
    main([cfg, out, "--no-copy-tokenizer", "--no-write-model-card"], standalone_mode=False)
"""


@pytest.fixture(scope="module")
def reference(fam: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, dict[str, torch.Tensor]]:
    """mergekit-yaml's outputs for each case."""
    root = tmp_path_factory.mktemp("mergekit")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = []
    for op in CASES:
        cfg = root / f"{op}.yml"
        cfg.write_text(yaml.safe_dump(_mergekit_config(op, fam)))
        args += [str(cfg), str(root / op)]
    proc = subprocess.run([sys.executable, "-c", _RUN_MERGEKIT_YAML, *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mergekit-yaml failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
    return {op: _load_raw(root / op) for op in CASES}


def _load_raw(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _ours(cat: Catalog, op: str, out: Path, **kw) -> tuple[dict, dict[str, torch.Tensor]]:
    experts = [{"model": n, "weight": w, **({"density": d} if op in WITH_DENSITY else {})}
               for n, w, d in zip(EXPERTS, WEIGHTS, DENSITIES, strict=True)]
    params = kw.pop("params", CASES.get(op, {}))
    threads = kw.pop("threads", None)
    req = build_request(base="base", experts=experts, operator=op, params=params, **kw)
    summary = merge(cat, req, out, threads=threads, output_name=f"{op}-{out.parent.name}-{out.name}").to_dict()
    return summary, _load_raw(out)


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance of two bf16 tensors in units in the last place (ordered bit patterns)."""
    def ordered(t: torch.Tensor) -> torch.Tensor:
        i = t.view(torch.int16).int()
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return (ordered(a) - ordered(b)).abs()


def test_mergekit_runs_on_the_factory_family(reference):
    assert set(reference["ties"]) == set(factory.LLAMA_SHAPES)
    assert all(t.dtype == torch.bfloat16 for t in reference["ties"].values())


@pytest.mark.parametrize("op", ["task_arithmetic", "linear"])
def test_additive_operators_match_mergekit(op, cat, reference, tmp_path):
    summary, ours = _ours(cat, op, tmp_path / op)
    assert summary["expert_bytes_read"] == summary["full_read_bytes"] > 0
    theirs = reference[op]
    assert set(ours) == set(theirs)
    off_by_one = 0
    for name, t in theirs.items():
        assert ours[name].dtype == torch.bfloat16 and ours[name].shape == t.shape, name
        ulps = _bf16_ulps(ours[name], t)
        if op == "task_arithmetic":
            assert torch.equal(ours[name], t), name
        else:
            assert int(ulps.max()) <= 1, name
        off_by_one += int((ulps == 1).sum())
    total = sum(t.numel() for t in theirs.values())
    assert off_by_one <= total // 100  # rounding flips are rare, not systematic


def test_ties_matches_mergekit_off_the_threshold(cat, fam, reference, tmp_path):
    summary, ours = _ours(cat, "ties", tmp_path / "ties")
    # the full budget of TIES reads only blocks that can pass the trim: below the full read
    assert 0 < summary["expert_bytes_read"] <= summary["full_read_bytes"]
    base = factory.load(fam["base"])
    deltas = {n: {k: v - base[k] for k, v in factory.load(fam[n]).items()} for n in EXPERTS}
    plan = make_plan(cat, build_request(
        base="base", operator="ties", params=CASES["ties"],
        experts=[{"model": n, "weight": w, "density": d}
                 for n, w, d in zip(EXPERTS, WEIGHTS, DENSITIES, strict=True)]))
    excluded = compared = 0
    for name, theirs in reference["ties"].items():
        tied = torch.zeros(theirs.shape, dtype=torch.bool)
        for n, dens in zip(EXPERTS, DENSITIES, strict=True):
            d = deltas[n][name]
            trim = exact_trim(d, dens)
            got = plan.trims.get((n, name))
            if got is not None:  # the catalog's threshold is the exact one
                assert (got.tau, got.above, got.tied, got.k) == (
                    trim.tau, trim.above, trim.tied, trim.k), (n, name)
            if trim.above + trim.tied > trim.k and trim.tau > 0:  # keeping a zero adds nothing
                tied |= d.abs() == trim.tau
        keep = ~tied
        assert torch.equal(ours[name][keep], theirs[keep]), name
        excluded += int(tied.sum())
        compared += int(keep.sum())
    total = sum(t.numel() for t in reference["ties"].values())
    assert compared + excluded == total
    # bf16 deltas put some entries exactly at the threshold (norm tensors: most of them)
    assert 0 < excluded < total // 20


def _block_rows(cat: Catalog) -> dict[tuple[str, int], tuple[int, int]]:
    return {(b.tensor, b.block_index): (b.row_start, b.row_end)
            for b in model_blocks(cat, "base")}


@pytest.mark.parametrize("op", ["dare_linear", "dare_ties"])
def test_dare_is_the_same_across_threads_and_budgets(op, cat, fam, tmp_path):
    # l2 ranking: its budget-0.4 plan leaves some output regions unread and reads others whole,
    # the two cases checked below (dare_ties' auto ranks this family's flat updates per_tensor,
    # which touches every region)
    params = {"rescale": "density", "lambda": 1.0, "utility": "l2"}
    full, a = _ours(cat, op, tmp_path / "t1", params=params, seed=9, threads=1)
    again, b = _ours(cat, op, tmp_path / "t3", params=params, seed=9, threads=3)
    assert full["output_hash"] == again["output_hash"]
    assert all(torch.equal(a[n], b[n]) for n in a)
    other, c = _ours(cat, op, tmp_path / "s10", params=params, seed=10)
    assert other["output_hash"] != full["output_hash"]

    low, d = _ours(cat, op, tmp_path / "low", params=params, seed=9, budget=0.4)
    assert 0 < low["expert_bytes_read"] < full["expert_bytes_read"]
    experts = [{"model": n, "weight": w, "density": p}
               for n, w, p in zip(EXPERTS, WEIGHTS, DENSITIES, strict=True)]
    plans = {f: make_plan(cat, build_request(base="base", experts=experts, operator=op,
                                             params=params, seed=9, budget=f))
             for f in (1.0, 0.4)}
    assert plans[0.4].plan_hash == low["plan_hash"]
    read = {f: {(b.tensor, b.block_index, b.model) for b in p.blocks} for f, p in plans.items()}
    base = _load_raw(fam["base"])
    same = untouched = 0
    for (tensor, index), (r0, r1) in _block_rows(cat).items():
        full_set = {m for t, i, m in read[1.0] if (t, i) == (tensor, index)}
        low_set = {m for t, i, m in read[0.4] if (t, i) == (tensor, index)}
        if not low_set:  # nothing read: the base block, untouched
            assert torch.equal(d[tensor][r0:r1], base[tensor][r0:r1]), (tensor, index)
            untouched += 1
        elif low_set == full_set:  # everything read: the same draw as at full budget
            assert torch.equal(d[tensor][r0:r1], a[tensor][r0:r1]), (tensor, index)
            same += 1
    assert same > 0 and untouched > 0


def test_dare_kept_fraction_end_to_end(cat, fam, tmp_path):
    """One expert, weight 1, no rescale: every merged entry is the expert's or the base's."""
    req = build_request(base="base", experts=[{"model": "e1", "density": 0.4}],
                        operator="dare_linear", params={"rescale": "none"}, seed=3)
    merge(cat, req, tmp_path / "one", output_name="dare-one")
    out, base, exp = (_load_raw(p) for p in (tmp_path / "one", fam["base"], fam["e1"]))
    kept = changed = 0
    for name, m in out.items():
        is_expert, is_base = m == exp[name], m == base[name]
        assert bool((is_expert | is_base).all()), name
        moved = exp[name] != base[name]
        kept += int((is_expert & moved).sum())
        changed += int(moved.sum())
    frac = kept / changed
    assert abs(frac - 0.4) < 5 * (0.4 * 0.6 / changed) ** 0.5, frac
