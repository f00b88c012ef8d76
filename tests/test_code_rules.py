"""Rules of the tree that no other test would notice breaking: test scaffolding stays in tests/,
docs stand alone, the kernel contract and the density grid are written once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mergepipe.core import hooks
from mergepipe.core.operators import REGISTRY
from mergepipe.core.operators.base import ExpertBlock, ReadExpert, as_read, read_experts
from mergepipe.core.operators.ties import grid_index, on_grid

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "mergepipe"
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "CONTRIBUTING.md"]


def sources(root: Path = SRC) -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted(root.rglob("*.py"))}


def test_test_scaffolding_stays_in_tests() -> None:
    """Hold switches read from the environment, the test client's Host name and the tests'
    PostgreSQL starter were product code."""
    found = [(name, word) for name, text in sources().items()
             for word in ("MERGEPIPE_TEST_", "testserver", "pg_local") if word in text]
    assert found == []
    assert not (SRC / "benchmarks" / "pg_local.py").exists()
    assert "os.environ" not in (SRC / "core" / "hooks.py").read_text()


def test_the_product_hooks_do_nothing_and_a_test_can_swap_them() -> None:
    default = hooks.hooks()
    assert type(default) is hooks.Hooks
    calls: list[str] = []

    class Recording(hooks.Hooks):
        def merge_staged(self, merge_id: str) -> None:
            calls.append(merge_id)

    old = hooks.install(Recording())
    try:
        hooks.hooks().merge_staged("m-1")
        hooks.hooks().region_started(0)  # not overridden: the no-op
    finally:
        assert type(hooks.install(old)) is Recording
    assert calls == ["m-1"] and hooks.hooks() is default


def test_no_reference_to_a_design_section_outside_the_repository() -> None:
    pattern = re.compile(r"DESIGN (section|§)")
    texts = {**sources(), **sources(REPO / "tests"),
             **{str(p.relative_to(REPO)): p.read_text() for p in DOCS}}
    assert [name for name, text in texts.items() if pattern.search(text)] == []


# A generated report's provenance line names the files of its time; it is history, not a path.
PROVENANCE = "Measured "


def test_paths_in_the_docs_exist() -> None:
    """`src/mergepipe/...` paths named in the docs exist, and no page names a module by its
    pre-src folder (`catalog/db.py`)."""
    named = re.compile(r"src/mergepipe/[\w/]+\.(?:py|c|sql)")
    bare = re.compile(r"(?:^|[^/\w.])(?:mergepipe/)?(?:catalog|executor|planner|service|storage|"
                      r"sandbox|core|jobs|cli)/[a-z_]+\.py")
    missing, stale = [], []
    for page in DOCS:
        for line in page.read_text().splitlines():
            if line.startswith(PROVENANCE):
                continue
            missing += [(page.name, p) for p in named.findall(line) if not (REPO / p).exists()]
            stale += [(page.name, m.strip()) for m in bare.findall(line)]
    assert missing == [] and stale == []


def test_read_experts_gives_the_read_experts_with_their_deltas() -> None:
    import torch

    d = torch.ones(3)
    blocks = [ExpertBlock(0, "a", None, 1.0, 1.0, None, 0),
              ExpertBlock(1, "b", d, 0.5, 1.0, None, 1)]
    read = read_experts(blocks)
    assert [(type(e), e.index, e.delta is d, e.weight) for e in read] == [(ReadExpert, 1, True, 0.5)]


def test_as_read_tells_a_read_expert_from_an_unread_one() -> None:
    import torch

    d = torch.ones(3)
    unread = ExpertBlock(0, "a", None, 1.0, 1.0, None, 0)
    read = ReadExpert(1, "b", d, 0.5, 1.0, None, 1)
    as_block = ExpertBlock(2, "c", d, 0.25, 0.5, None, 2)
    assert as_read(unread) is None and as_read(read) is read
    converted = as_read(as_block)
    assert type(converted) is ReadExpert and converted == ReadExpert(2, "c", d, 0.25, 0.5, None, 2)


def test_kernels_do_not_filter_deltas_again() -> None:
    """`as_read` / `read_experts` are the one place that knows a block was not read: no kernel
    filters or asserts on a None delta again (a sparsifier takes a ReadExpert)."""
    ops = SRC / "core" / "operators"
    again = [p.name for p in sorted(ops.glob("*.py"))
             if "read_experts(" in p.read_text() and p.name != "base.py"
             and "delta is not None" in p.read_text()]
    assert again == []
    asserted = [p.name for p in sorted(ops.glob("*.py"))
                if re.search(r"assert \w+\.delta is not None", p.read_text())]
    assert asserted == []


def test_the_density_grid_is_tested_in_one_place() -> None:
    assert (grid_index(0.53), grid_index(1.0), grid_index(0.01)) == (53, 100, 1)
    assert grid_index(0.525) is None and grid_index(0.0) is None and grid_index(1.5) is None
    assert on_grid(0.3) and on_grid(0.07) and not on_grid(0.333)
    copies = [name for name, text in sources().items()
              if re.search(r"\* ?(100|TRIM_GRID) - (round|j)", text)
              and not name.endswith("core/operators/ties.py")]
    assert copies == []


def test_the_fused_operators_are_declared_by_their_specs() -> None:
    from mergepipe.core.operators import fused

    named = {s.name for s in REGISTRY.values() if s.fused is not None}
    assert named == {"linear", "task_arithmetic", "ties", "dare_linear", "dare_ties"}
    assert not hasattr(fused, "FUSED_OPS") and not hasattr(fused, "op_name")


# what a test module names when it needs a server or an outside program: the server fixtures
# (tests/conftest.py), the S3 and Ray starters, mergekit runs, `mergepipe serve`, a browser, Docker
NEEDS_A_SERVER = ("postgres_url", "postgres_admin_url", "ray_runtime", "s3_server", "moto_server",
                  "local_ray", "mergekit_parity", "mergekit-yaml", '"serve"', "playwright",
                  "docker")


def unit_modules() -> list[str]:
    lines = (REPO / "tests" / "unit.txt").read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.parametrize("path", unit_modules())
def test_the_unit_tier_needs_no_server(path: str) -> None:
    """`make test-unit` runs the modules of tests/unit.txt: each exists and names no server."""
    text = (REPO / path).read_text()
    if path.endswith("test_code_rules.py"):  # this module names them to look for them
        text = text.split("NEEDS_A_SERVER =", 1)[0]
    assert [w for w in NEEDS_A_SERVER if w in text] == []


def test_the_documented_layers_are_the_contract() -> None:
    """CONTRIBUTING.md's one-line layer order and architecture.md's diagram name the layers of
    the import-linter contract, in its order."""
    import tomllib

    contract = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in contract["contracts"] if c["type"] == "layers")
    line = " > ".join(layer.replace("mergepipe.", "") for layer in layers)
    assert line in (REPO / "CONTRIBUTING.md").read_text()
    diagram = (REPO / "docs" / "architecture.md").read_text().split("```")[1]
    order = [w for w in re.findall(r"mergepipe\.(\w+)", diagram)]
    assert order == [p.replace("mergepipe.", "") for layer in layers for p in layer.split(" | ")]


def test_license_changelog_and_contributing_are_there() -> None:
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text and len(license_text) > 10_000
    assert "## Unreleased" in (REPO / "CHANGELOG.md").read_text()
    contributing = (REPO / "CONTRIBUTING.md").read_text()
    for heading in ("## Layers", "## Adding an operator", "## Adding a store", "## Tests"):
        assert heading in contributing


def test_a_process_started_by_a_test_gets_the_tests_hooks(tmp_path: Path) -> None:
    """child_env: the child's sitecustomize installs the hold hooks before any of its code runs
    (the product reads nothing from the environment)."""
    import os
    import subprocess
    import sys

    from tests.site_hooks.hold_hooks import child_env

    code = ("from mergepipe.core import hooks\n"
            "hooks.hooks().merge_staged('m-1')\n"
            "hooks.hooks().region_started(1)\n"  # indexed points hold index 0 only
            "import os\n"
            "print(type(hooks.hooks()).__name__, os.getpid())\n")
    env = child_env(os.environ, tmp_path, "merge_staged", "region_started")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    kind, pid = done.stdout.split()
    assert kind == "HoldHooks"
    assert (tmp_path / "starts").read_text().split() == [pid]  # merge_staged, not region 1
