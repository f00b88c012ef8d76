"""Dockerfile, docker-compose.yml and .dockerignore, checked by reading (no engine here): a
builder stage makes the wheel, the image installs it (no checkout), torch keeps its pin, the
settings are ones the server reads; and the image's start command, with the image's settings,
run from the venv the wheel test installs the wheel into, answers its healthcheck."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from mergepipe.core.settings import Settings
from tests.test_wheel import Installed, clean_env, free_port, serving, wheel_install

REPO = Path(__file__).resolve().parent.parent


def _stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's stages, each a list of (INSTRUCTION, arguments), continuations joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        m = re.match(r"^\s*([A-Z]+)\s+(.*)$", line)
        if not m or line.lstrip().startswith("#"):
            continue
        if m.group(1) == "FROM":
            stages.append([])
        stages[-1].append((m.group(1), m.group(2).strip()))
    return stages


def _image_env() -> dict[str, str]:
    """ENV of the final stage, then the compose service's environment (set values only)."""
    env: dict[str, str] = {}
    for kw, args in _stages()[-1]:
        if kw == "ENV":
            env.update(item.partition("=")[::2] for item in shlex.split(args))
    api = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["api"]
    env.update({k: str(v) for k, v in api["environment"].items() if not str(v).startswith("${")})
    return env


def _dockerfile_cmd() -> list[str]:
    text = (REPO / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, flags=re.M)
    return list(json.loads(cmd))


def test_compose_service_runs_the_tested_start_command() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    assert api["command"] == _dockerfile_cmd()
    assert api["command"][:2] == ["mergepipe", "serve"]
    assert api["command"][api["command"].index("--port") + 1] == "8000"
    assert any(p.endswith(":8000") for p in api["ports"])
    assert "/healthz" in " ".join(api["healthcheck"]["test"])
    assert "/healthz" in (REPO / "Dockerfile").read_text()


def test_compose_environment_is_what_settings_read() -> None:
    env = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["api"]["environment"]
    env = {k: str(v) for k, v in env.items() if not str(v).startswith("${")}
    s = Settings.from_env(env)
    assert str(s.catalog) == env["MERGEPIPE_CATALOG"]
    assert [str(p) for p in s.data_roots] == [env["MERGEPIPE_DATA_ROOTS"]]
    assert str(s.output_root) == env["MERGEPIPE_OUTPUT_ROOT"]
    assert s.workers == int(env["MERGEPIPE_WORKERS"])
    assert s.max_body_bytes == int(env["MERGEPIPE_MAX_BODY_BYTES"])
    assert s.sql_row_limit == int(env["MERGEPIPE_SQL_ROW_LIMIT"])
    assert s.sql_timeout_s == float(env["MERGEPIPE_SQL_TIMEOUT_S"])
    assert s.sql_result_bytes == int(env["MERGEPIPE_SQL_RESULT_BYTES"])
    assert s.shutdown_grace_s == float(env["MERGEPIPE_SHUTDOWN_GRACE_S"])
    assert s.max_queued_jobs == int(env["MERGEPIPE_MAX_QUEUED_JOBS"])


def test_volumes_hold_the_catalog_models_and_outputs() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    targets = {v.split(":")[1] for v in api["volumes"]}
    env = api["environment"]
    assert str(Path(env["MERGEPIPE_CATALOG"]).parent) in targets
    assert {env["MERGEPIPE_DATA_ROOTS"], env["MERGEPIPE_OUTPUT_ROOT"]} <= targets
    assert any(v.endswith(":ro") and env["MERGEPIPE_DATA_ROOTS"] in v for v in api["volumes"])


def test_bad_environment_values_name_the_variable() -> None:
    import pytest

    from mergepipe.core.errors import InvalidRequest

    for key, raw in (("MERGEPIPE_WORKERS", "two"), ("MERGEPIPE_WORKERS", "0"),
                     ("MERGEPIPE_SQL_TIMEOUT_S", "nan"), ("MERGEPIPE_MAX_BODY_BYTES", "-1")):
        with pytest.raises(InvalidRequest, match=key):
            Settings.from_env({key: raw})


def test_the_image_installs_the_wheel_built_in_a_builder_stage() -> None:
    builder, final = _stages()[0], _stages()[-1]
    assert len(_stages()) == 2
    from_builder = builder[0][1].split()
    assert from_builder[-2].upper() == "AS"
    runs = " && ".join(a for kw, a in builder if kw == "RUN")
    assert re.search(r"pip wheel --no-deps (--wheel-dir|-w) /dist \.", runs), runs
    copies = [a for kw, a in final if kw == "COPY"]
    assert copies == [f"--from={from_builder[-1]} /dist/ /tmp/dist/"]  # no checkout, no COPY .
    final_runs = [a for kw, a in final if kw == "RUN"]
    assert any(re.search(r"pip install /tmp/dist/mergepipe-\*\.whl", a) for a in final_runs)
    assert not any(re.search(r"pip install\s(.*\s)?(-e|--editable)\s", a) for a in final_runs)


def test_torch_keeps_its_pin_and_the_index_build_arg() -> None:
    (pin,) = [d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "dependencies"] if d.startswith("torch")]
    final = _stages()[-1]
    assert ("ARG", "TORCH_INDEX_URL=") in final
    (torch_run,) = [a for kw, a in final if kw == "RUN" and "torch" in a]
    assert f'"{pin}"' in torch_run and "$TORCH_INDEX_URL" in torch_run
    # torch is installed before the wheel, so the wheel's torch requirement is already met
    runs = [a for kw, a in final if kw == "RUN"]
    assert runs.index(torch_run) < next(i for i, a in enumerate(runs) if ".whl" in a)
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert "TORCH_INDEX_URL" in compose["services"]["api"]["build"]["args"]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule, simplified: a path is out when it or a parent matches a pattern (no '!')."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pat in patterns:
        rx = re.escape(pat).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        if any(re.fullmatch(rx, p) for p in prefixes):
            return True
    return False


def test_dockerignore_keeps_what_the_wheel_is_built_from() -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns)  # _ignored does not do exceptions
    for out in (".git/config", ".venv/bin/python",
                "src/mergepipe/catalog/__pycache__/db.cpython-311.pyc",
                "mergepipe.egg-info/PKG-INFO", "build/lib/x.py", "demo.duckdb"):
        assert _ignored(out, patterns), out
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    needed = [f for f in listed if f.startswith("src/")]
    needed += ["pyproject.toml", "setup.py", "README.md"]
    assert "src/mergepipe/migrations/catalog_schema.sql" in needed
    assert [f for f in needed if _ignored(f, patterns)] == []


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return wheel_install(tmp_path_factory)


@pytest.mark.slow  # a second wheel install (~25 s); test_wheel.py keeps the wheel in make test
def test_image_start_command_answers_its_healthcheck(installed: Installed, tmp_path: Path) -> None:
    """CMD with the image's settings (paths under /data moved into tmp_path, the port made free
    and the host loopback), from the wheel's venv; then the HEALTHCHECK command, then SIGTERM."""
    def moved(v: str) -> str:
        return str(tmp_path) + v if v == "/data" or v.startswith("/data/") else v

    env = {k: moved(v) for k, v in _image_env().items()
           if k.startswith(("MERGEPIPE_", "PYTHONUNBUFFERED"))}
    for key in ("MERGEPIPE_DATA_ROOTS", "MERGEPIPE_OUTPUT_ROOT"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    Path(env["MERGEPIPE_CATALOG"]).parent.mkdir(parents=True, exist_ok=True)
    (workdir,) = [moved(a) for kw, a in _stages()[-1] if kw == "WORKDIR"]
    cmd, port = _dockerfile_cmd(), free_port()
    assert cmd[0] == "mergepipe"
    cmd[cmd.index("--port") + 1] = str(port)
    cmd[cmd.index("--host") + 1] = "127.0.0.1"
    (health,) = [a for kw, a in _stages()[-1] if kw == "HEALTHCHECK"]
    probe = json.loads(health.split(" CMD ", 1)[1])
    assert probe[0] == "python" and ":8000/healthz" in probe[-1]
    with serving(installed, Path(workdir), cmd[1:], env, port):
        proc = subprocess.run([str(installed.python), *probe[1:-1],
                               probe[-1].replace(":8000/", f":{port}/")],
                              env=clean_env(env), capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
    assert Path(env["MERGEPIPE_CATALOG"]).is_file()  # the catalog went where the image says
