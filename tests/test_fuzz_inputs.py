"""Property-based fuzzing of what parses untrusted input: the safetensors header parser (random
and mutated bytes), the merge request validator, and the API's request schema: nothing but our
own error types comes out, and whatever is accepted is valid."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mergepipe.core.errors import InvalidCheckpoint, InvalidRequest, MergePipeError
from mergepipe.core.operators import REGISTRY
from mergepipe.core.request import Budget, MergeRequest, build_request
from mergepipe.core.vocab import DTYPE_SIZES
from mergepipe.storage.safetensors_format import (
    MAX_HEADER_BYTES,
    encode_header,
    read_header,
)

OPERATORS = tuple(REGISTRY)

FAST = settings(max_examples=100, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
THOROUGH = settings(FAST, max_examples=3000)

# -- the safetensors header parser ----------------------------------------------------------------
JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
JSON = st.recursive(JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
ENTRY = st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from([*DTYPE_SIZES, "I8", "F64", "bf16", ""]), JSON),
    "shape": st.one_of(st.lists(st.integers(-3, 2**50), max_size=9), JSON),
    "data_offsets": st.one_of(st.lists(st.integers(-10, 2**64), max_size=3), JSON),
})
HEADERS = st.dictionaries(st.text(min_size=0, max_size=10), st.one_of(ENTRY, JSON), max_size=5)


def _write(tmp: Path, data: bytes) -> Path:
    p = tmp / "fuzz.safetensors"
    p.write_bytes(data)
    return p


def _parse(path: Path) -> None:
    """read_header succeeds with a consistent result, or raises InvalidCheckpoint."""
    try:
        h = read_header(path)
    except InvalidCheckpoint as e:
        assert str(path) in e.message
        return
    size = path.stat().st_size
    end = h.header_len
    for t in sorted(h.tensors, key=lambda t: t.data_offset):
        assert t.dtype in DTYPE_SIZES
        assert t.nbytes == math.prod(t.shape) * DTYPE_SIZES[t.dtype]
        assert h.header_len <= t.data_offset and t.data_offset + t.nbytes <= size
        assert t.nbytes == 0 or t.data_offset >= end  # no overlaps
        end = max(end, t.data_offset + t.nbytes)


@FAST
@given(data=st.binary(max_size=300))
@example(data=b"")
@example(data=struct.pack("<Q", 2**64 - 1))
@example(data=struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
@example(data=struct.pack("<Q", 10) + b"{}")
@example(data=struct.pack("<Q", 2) + b"\xff\xfe")
@example(data=struct.pack("<Q", 4) + b"[1] ")
@example(data=struct.pack("<Q", 20002) + b"[" * 10001 + b"]" * 10001)
def test_random_bytes(tmp_path: Path, data: bytes) -> None:
    _parse(_write(tmp_path, data))


@FAST
@given(header=HEADERS, tail=st.binary(max_size=64), pad=st.integers(0, 3))
def test_random_json_headers(tmp_path: Path, header: dict[str, Any], tail: bytes,
                             pad: int) -> None:
    js = json.dumps(header, allow_nan=True).encode() + b" " * pad
    _parse(_write(tmp_path, struct.pack("<Q", len(js)) + js + tail))


def _valid_file() -> bytes:
    entries = [("a", "F32", (2, 3)), ("b", "BF16", (4,)), ("c", "F16", (1, 2, 2)),
               ("empty", "F32", (0, 5))]
    head, spans = encode_header(entries, {"format": "pt"})
    return head + bytes(range(256))[: spans[-1][1]]


@FAST
@given(edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), min_size=1,
                      max_size=6),
       cut=st.one_of(st.none(), st.integers(0, 400)))
def test_mutated_valid_files(tmp_path: Path, edits: list[tuple[int, int]],
                             cut: int | None) -> None:
    data = bytearray(_valid_file())
    for pos, byte in edits:
        data[pos % len(data)] = byte
    _parse(_write(tmp_path, bytes(data[:cut] if cut is not None else data)))


@pytest.mark.slow
@THOROUGH
@given(header=HEADERS, tail=st.binary(max_size=64), data=st.binary(max_size=600))
def test_headers_thoroughly(tmp_path: Path, header: dict[str, Any], tail: bytes,
                            data: bytes) -> None:
    js = json.dumps(header, allow_nan=True).encode()
    _parse(_write(tmp_path, struct.pack("<Q", len(js)) + js + tail))
    _parse(_write(tmp_path, data))


# -- the merge request validator --------------------------------------------------------------------
NUMBERS = st.one_of(st.integers(-2**70, 2**1100), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, 0.5, 1e-300, 10**400, -0.0]))
ANY = st.one_of(NUMBERS, st.none(), st.booleans(), st.text(max_size=12),
                st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4),
                                                                     st.integers(), max_size=2))
EXPERT = st.one_of(ANY, st.fixed_dictionaries({"model": st.one_of(st.sampled_from(["e0", "e1",
                                                                                   "base"]), ANY)},
                                              optional={"weight": st.one_of(NUMBERS, ANY),
                                                        "density": st.one_of(NUMBERS, ANY),
                                                        "colour": ANY}))
BUDGETS = st.one_of(
    NUMBERS, ANY, st.text(alphabet="0123456789.eE+-KMGTiB kb", max_size=30),
    st.fixed_dictionaries({}, optional={"fraction": st.one_of(NUMBERS, ANY),
                                        "bytes": st.one_of(NUMBERS, ANY), "x": ANY}))
PARAMS = st.dictionaries(st.sampled_from(["normalize", "lambda", "rescale", "renormalize",
                                          "density", "int8_mask"]),
                         st.one_of(NUMBERS, ANY, st.sampled_from(["true", "l1", "selected"])),
                         max_size=4)


def _check_accepted(r: MergeRequest) -> None:
    assert r.operator in OPERATORS and r.experts
    assert isinstance(r.budget, Budget)
    if r.budget.fraction is not None:
        assert math.isfinite(r.budget.fraction) and r.budget.fraction > 0
    else:
        assert isinstance(r.budget.bytes, int) and r.budget.bytes > 0
    for e in r.experts:
        assert math.isfinite(e.weight)
        assert e.density is None or 0 < e.density <= 1
    assert all(0 < d <= 1 for d in r.densities())
    assert isinstance(r.seed, int) and 0 <= r.seed < 2**63
    json.dumps(r.to_dict(), allow_nan=False)  # stored as JSON in the catalog


def _validate(**kw: Any) -> None:
    try:
        r = build_request(**kw)
    except MergePipeError as e:
        assert isinstance(e, InvalidRequest) and e.message
        return
    _check_accepted(r)


@FAST
@given(base=st.one_of(st.just("base"), ANY), experts=st.one_of(st.lists(EXPERT, max_size=4),
                                                                 st.text(max_size=20)),
       operator=st.one_of(st.sampled_from([*OPERATORS, "avg", "TIES", "magic", ""]), ANY),
       params=st.one_of(PARAMS, st.none()), budget=st.one_of(BUDGETS, st.none()),
       seed=st.one_of(st.integers(-5, 2**64), ANY), dtype=st.one_of(
           st.none(), st.sampled_from(["bf16", "float32", "int8", ""])))
@example(base="base", experts=[{"model": "e0"}], operator="linear", params=None,
         budget={"fraction": 10**400}, seed=0, dtype=None)
@example(base="base", experts=[{"model": "e0", "weight": 10**400}], operator="linear",
         params=None, budget=0.5, seed=0, dtype=None)
@example(base="base", experts=[{"model": "e0"}], operator="linear", params={"lambda": 10**400},
         budget=0.5, seed=0, dtype=None)
@example(base="base", experts=[{"model": "e0"}], operator="linear", params=None,
         budget={"bytes": 10**400}, seed=0, dtype=None)
@example(base="base", experts=[{"model": "e0"}], operator="linear", params=None,
         budget=float("nan"), seed=0, dtype=None)
@example(base="base", experts="e0:1e999:0.5", operator="ties", params=None, budget="1e999GiB",
         seed=0, dtype=None)
def test_build_request_accepts_valid_or_raises_invalid_request(
        base: Any, experts: Any, operator: Any, params: Any, budget: Any, seed: Any,
        dtype: Any) -> None:
    _validate(base=base, experts=experts, operator=operator, params=params, budget=budget,
              seed=seed, output_dtype=dtype)


@pytest.mark.slow
@settings(FAST, max_examples=5000)
@given(experts=st.lists(EXPERT, min_size=1, max_size=4), operator=st.sampled_from(OPERATORS),
       params=PARAMS, budget=BUDGETS, seed=st.one_of(st.integers(-5, 2**64), ANY))
def test_build_request_thoroughly(experts: Any, operator: Any, params: Any, budget: Any,
                                  seed: Any) -> None:
    _validate(base="base", experts=experts, operator=operator, params=params, budget=budget,
              seed=seed)


# -- the API's request schema (the same validation behind /v1/plans and /v1/merges) -------------
@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.api_helpers import client_for, make_family, register_family, settings_for

    tmp = tmp_path_factory.mktemp("fuzz-api")
    family = make_family(tmp / "data" / "family")
    with client_for(settings_for(tmp), raise_server_exceptions=False) as c:
        register_family(c, family)
        yield c


PLAN_FIELDS = st.fixed_dictionaries({}, optional={
    "base": st.one_of(st.just("base"), ANY), "experts": st.one_of(st.lists(EXPERT, max_size=3),
                                                                  ANY),
    "operator": st.one_of(st.sampled_from([*OPERATORS, "avg", "magic"]), ANY),
    "params": st.one_of(PARAMS, ANY), "budget": st.one_of(BUDGETS, ANY),
    "seed": st.one_of(st.integers(-5, 2**64), ANY), "config_yaml": st.one_of(st.none(), ANY),
    "extra": ANY})


def _post_plan(client: Any, body: dict[str, Any]) -> None:
    raw = json.dumps(body, allow_nan=True, default=str)
    r = client.post("/v1/plans", content=raw, headers={"content-type": "application/json"})
    assert r.status_code < 500, (body, r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()
        assert set(err) == {"error"} and err["error"]["message"], r.text[:300]
    else:
        assert r.json()["planned_expert_bytes"] <= r.json()["budget_bytes"]


@FAST
@given(patch=PLAN_FIELDS)
def test_plan_bodies_never_get_a_5xx(api: Any, patch: dict[str, Any]) -> None:
    body = {"base": "base", "experts": [{"model": "e0"}, {"model": "e1"}], "operator": "ties",
            "params": {"density": 0.5}, "budget": {"fraction": 0.5}, "seed": 1}
    _post_plan(api, {**body, **patch})


@pytest.mark.slow
@settings(FAST, max_examples=2000)
@given(patch=PLAN_FIELDS)
def test_plan_bodies_thoroughly(api: Any, patch: dict[str, Any]) -> None:
    _post_plan(api, {"base": "base", "experts": [{"model": "e0"}], "operator": "linear",
                     "budget": {"fraction": 0.5}, **patch})
