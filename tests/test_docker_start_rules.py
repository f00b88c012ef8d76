"""Every service of docker-compose.yml starts by the service's own rules (no Docker engine here):
each service's command is parsed by mergepipe's own parser and its environment, interpolated as
compose does from the user's environment over the image's ENV, goes through `serve`'s or
`worker`'s own start-up checks (cli/commands/serve.py start_settings, worker.py check_catalog);
and every service of the image can build it, so each profile starts on its own."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from mergepipe.cli.commands.serve import start_settings
from mergepipe.cli.commands.worker import check_catalog
from mergepipe.cli.main import build_parser
from mergepipe.core.errors import InvalidRequest
from mergepipe.core.settings import Settings

REPO = Path(__file__).resolve().parent.parent
_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?-)([^}]*))?\}|\$(\w+)")
# what a user may have in the environment: nothing, a token, a password
USER_ENVS: tuple[dict[str, str], ...] = ({}, {"MERGEPIPE_API_TOKEN": "tok"}, {"POSTGRES_PASSWORD": "pw"})


def interpolate(value: str, user: dict[str, str]) -> str:
    """compose's interpolation: ${VAR}, ${VAR:-default} (unset or empty), ${VAR-default}
    (unset), $VAR and $$."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if m.group(2) == ":-":
            return user.get(name) or m.group(3)
        if m.group(2) == "-":
            return user[name] if name in user else m.group(3)
        return user.get(name, "")
    return _VAR.sub(sub, value)


def _compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def _image_env() -> dict[str, str]:
    """The Dockerfile's final-stage ENV."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    stage = text.split("\nFROM ")[-1]
    env: dict[str, str] = {}
    for m in re.finditer(r"^ENV\s+(.*)$", stage, flags=re.M):
        env.update(item.partition("=")[::2] for item in shlex.split(m.group(1)))
    return env


def _dockerfile_cmd() -> list[str]:
    import json
    (cmd,) = re.findall(r"^CMD (\[.*\])$", (REPO / "Dockerfile").read_text(), flags=re.M)
    return list(json.loads(cmd))


def _ours() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _compose()["services"].items()
            if str(s.get("image", "")).startswith("mergepipe:")}


def service_env(service: dict[str, Any], user: dict[str, str]) -> dict[str, str]:
    env = _image_env()
    env.update({k: interpolate(str(v), user) for k, v in (service.get("environment") or {}).items()})
    return env


def start(service: dict[str, Any], env: dict[str, str]) -> str:
    """Apply the service's own start-up checks; the command it runs."""
    command = service.get("command") or _dockerfile_cmd()
    assert command[0] == "mergepipe", command
    args = build_parser().parse_args(command[1:])
    settings = Settings.from_env(env)
    if args.command == "serve":
        start_settings(args.host, settings, env)
    elif args.command == "worker":
        check_catalog(settings)
    else:
        pytest.fail(f"unexpected service command {command}")
    return str(args.command)


def test_the_image_services_are_a_server_a_cluster_server_and_workers() -> None:
    assert {n: start(s, service_env(s, {})) for n, s in _ours().items()} == {
        "api": "serve", "cluster-api": "serve", "worker": "worker"}


@pytest.mark.parametrize("user", USER_ENVS, ids=["no-env", "token", "password"])
def test_every_service_passes_its_own_start_up_checks(user: dict[str, str]) -> None:
    for name, service in _ours().items():
        env = service_env(service, user)
        try:
            start(service, env)
        except InvalidRequest as e:
            pytest.fail(f"{name} would restart forever with {user}: {e.message}")


def test_the_checks_bite_where_the_port_is_not_loopback_only() -> None:
    """Not vacuous: told the port is published elsewhere (LOOPBACK_ONLY=0), without a token,
    both servers refuse; with a token they start."""
    for name in ("api", "cluster-api"):
        service = _ours()[name]
        with pytest.raises(InvalidRequest, match="MERGEPIPE_API_TOKEN"):
            start(service, service_env(service, {"MERGEPIPE_LOOPBACK_ONLY": "0"}))
        start(service, service_env(service, {"MERGEPIPE_LOOPBACK_ONLY": "0",
                                             "MERGEPIPE_API_TOKEN": "tok"}))
    worker = _ours()["worker"]
    with pytest.raises(InvalidRequest, match="shared catalog"):
        start(worker, {**service_env(worker, {}), "MERGEPIPE_CATALOG": "/data/c.duckdb"})


def test_loopback_only_is_claimed_only_where_every_port_is_on_loopback() -> None:
    for name, service in _ours().items():
        env = service_env(service, {})
        if env.get("MERGEPIPE_LOOPBACK_ONLY") == "1":
            ports = service.get("ports") or []
            assert ports and all(p.startswith("127.0.0.1:") for p in ports), name


def test_every_service_of_the_image_builds_it() -> None:
    """`docker compose --profile cluster up postgres cluster-api worker` builds the image:
    no service names mergepipe:latest without a build of it."""
    for name, service in _ours().items():
        build = service.get("build")
        assert isinstance(build, dict), f"{name}: image {service['image']} without build:"
        assert (REPO / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()
        assert build["args"]["EXTRAS"] == "cluster", name  # the cluster services need psycopg
