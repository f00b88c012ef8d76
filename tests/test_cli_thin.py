"""The CLI is thin over the Python API: its command modules reach the catalog only through
`mergepipe.api.Catalog` (one implementation per operation, which the service's routes share
through the jobs layer), and a command's `--json` is what the API returns for the same catalog."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from mergepipe.cli.main import main
from mergepipe.core.jsonable import jsonable
from tests import factory

CLI = Path(__file__).resolve().parents[1] / "src" / "mergepipe" / "cli"

# What every command module may import from mergepipe: the API, the core's values and errors,
# the CLI's own formatting and options. Anything else must be listed here with its reason.
ALLOWED = ("mergepipe.api", "mergepipe.core", "mergepipe.cli")
EXTRA = {
    "merge.py": ("mergepipe.jobs.recovery",),  # a killed `mergepipe merge`'s leftovers
    "serve.py": ("mergepipe.service",),  # hosts the HTTP service
    "worker.py": ("mergepipe.jobs.shared_runner",),  # hosts a job runner
}


def _runtime_imports(tree: ast.AST) -> list[str]:
    """The mergepipe modules a module imports when it runs (not those under TYPE_CHECKING)."""
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.orelse:
                visit(stmt)
            return
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            out.append(module)
            if module == "mergepipe":  # from mergepipe import x: the package's lazy names
                out.extend(f"mergepipe.{a.name}" for a in node.names
                           if a.name[:1].islower())
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return [m for m in out if m == "mergepipe" or m.startswith("mergepipe.")]


def _private_paths(name: str, source: str) -> list[str]:
    allowed = ALLOWED + EXTRA.get(name, ())
    return [m for m in _runtime_imports(ast.parse(source))
            if m != "mergepipe" and not m.startswith(tuple(p for p in allowed))]


def _command_sources() -> dict[str, str]:
    files = [*sorted((CLI / "commands").glob("*.py")), CLI / "mergekit_cli.py",
             CLI / "beside.py", CLI / "job_options.py"]
    return {f.name: f.read_text() for f in files}


def test_cli_commands_reach_the_catalog_only_through_the_api() -> None:
    sources = _command_sources()
    assert {"ingest.py", "models.py", "plan.py", "merge.py", "replay.py", "sql.py",
            "rm.py"} <= set(sources)
    found = {name: bad for name, src in sources.items() if (bad := _private_paths(name, src))}
    assert found == {}, f"CLI modules importing below the API: {found}"


def test_the_check_sees_a_private_path() -> None:
    """What the check above must refuse: lower layers imported in a function, by any form."""
    for line in ("from mergepipe.catalog.models import list_models",
                 "from mergepipe.jobs.planning import plan_merge",
                 "import mergepipe.sandbox.user_sql",
                 "from mergepipe.executor import stream"):
        src = f"def run(args):\n    {line}\n"
        assert _private_paths("models.py", src), line
    typed = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
             "    from mergepipe.catalog.models import ModelRow\n")
    assert _private_paths("models.py", typed) == []
    assert _private_paths("merge.py", "from mergepipe.jobs.recovery import x\n") == []
    assert _private_paths("plan.py", "from mergepipe.jobs.recovery import x\n")


# -- the same answers ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("thin")
    base = factory.make_base(root / "base", seed=3)
    factory.make_expert(base, root / "e1", seed=4)
    factory.make_expert(base, root / "e2", seed=5, scale=0.02)
    return {"root": root, "db": str(root / "c.duckdb")}


def cli_json(capsys: pytest.CaptureFixture[str], db: str, *args: str) -> Any:
    capsys.readouterr()
    assert main(["--catalog", db, *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cli_answers_what_the_api_returns(family: dict[str, Any], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import mergepipe

    root, db = family["root"], family["db"]
    ingested = cli_json(capsys, db, "ingest", str(root / "base"), "--name", "base")
    cli_json(capsys, db, "ingest", str(root / "e1"), "--name", "e1", "--base", "base")
    with mergepipe.Catalog(db) as cat:
        ours = cat.ingest(root / "e2", "e2", base="base", progress=False)
        assert ingested == jsonable(cat.model("base"))
        assert cli_json(capsys, db, "models") == jsonable(cat.models())
        assert [m["name"] for m in jsonable(cat.models())] == ["base", "e1", "e2"]
        assert ours.has_stats and cat.model("e1").has_stats

        req: dict[str, Any] = dict(base="base", experts="e1,e2:0.5", operator="ties",
                   params={"density": 0.5}, budget=0.4, seed=2)
        plan = cli_json(capsys, db, "plan", "--base", "base", "--experts", "e1,e2:0.5",
                        "--op", "ties", "--param", "density=0.5", "--budget", "0.4",
                        "--seed", "2")
        summary = jsonable(cat.plan(**req).summary())
        for volatile in ("planning_seconds",):
            plan.pop(volatile), summary.pop(volatile)
        assert plan == summary

        query = "SELECT name, kind, base FROM models ORDER BY name"
        assert cli_json(capsys, db, "sql", query) == jsonable(cat.sql(query)) == {
            "columns": ["name", "kind", "base"],
            "rows": [["base", "full", None], ["e1", "full", "base"], ["e2", "full", "base"]],
            "truncated": False}

        merged = cli_json(capsys, db, "merge", "--base", "base", "--experts", "e1,e2:0.5",
                          "--op", "ties", "--param", "density=0.5", "--budget", "0.4",
                          "--seed", "2", "--out", str(tmp_path / "by-cli"))
        again = cat.merge(out=tmp_path / "by-api", progress=False, **req)
        assert merged["plan_hash"] == again.plan_hash == summary["plan_hash"]
        assert merged["expert_bytes_read"] == again.expert_bytes_read
        cli_replay = cli_json(capsys, db, "replay", merged["merge_id"])
        api_replay = jsonable(cat.replay(merged["merge_id"]))
        for r in (cli_replay, api_replay):
            r.pop("wall_seconds")
        assert cli_replay == api_replay and api_replay["match"] is True

        removed = cli_json(capsys, db, "rm", "by-cli")
        assert removed["retired"] == ["by-cli"]
        assert sorted(m.name for m in cat.models()) == ["base", "by-api", "e1", "e2"]


def test_the_api_and_the_service_share_lineage(tmp_path: Path) -> None:
    """One lineage function under both: the API's unknown model is the service's 404 (its
    message and field), and a model's ancestors are the route's."""
    import mergepipe
    from mergepipe.service.routes.lineage import lineage
    from mergepipe.service.state import AppState

    base = factory.make_base(tmp_path / "base", seed=6)
    factory.make_expert(base, tmp_path / "e1", seed=7)
    with mergepipe.Catalog(tmp_path / "c.duckdb") as cat:
        cat.ingest(base, "base", progress=False)
        cat.ingest(tmp_path / "e1", "e1", base="base", progress=False)
        cat.merge(base="base", experts=["e1"], operator="linear", out=tmp_path / "m",
                  progress=False)
        with pytest.raises(mergepipe.NotFound) as e:
            cat.lineage("ghost")
        assert (e.value.message, e.value.field) == ("model 'ghost' not found", "name")
        route = lineage("m", AppState(cat.settings, cat.db, None))  # type: ignore[arg-type]
        ours = cat.lineage("m")
        assert route["ancestors"] == jsonable(ours.ancestors)
        assert {(e["parent"], e["role"]) for e in route["ancestors"]} == {
            ("base", "base"), ("e1", "expert")}
