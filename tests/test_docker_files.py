"""Dockerfile and docker-compose.yml, checked by reading (no engine here): same start command
as the end-to-end test, settings the server actually reads, a healthcheck on /healthz."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from mergepipe.core.settings import Settings

REPO = Path(__file__).resolve().parent.parent


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
