"""Consistency of the deployment files in docker/ with each other and with the proxy.

No image is built or run here (no Docker engine in CI): these tests read docker/Dockerfile,
docker/compose.yaml and docker/prometheus.yml, check that the ports, names, flags and timings
they state agree, feed the image's command line to the real CLI parser, and run that command
line (with the listen address moved to loopback) and docker/healthcheck.py on this machine.
``docker compose config`` validates compose.yaml where a compose CLI is installed.
Every PromQL of the Grafana dashboard is evaluated by Prometheus's own engine (``promtool test
rules``, Debian package ``prometheus``) over the series of a rendered /metrics page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.commands.arguments import build_parser
from proxy.commands.ports import free_port
from proxy.config import ConfigError, load_config, parse_listen
from proxy.core.record import Outcome
from proxy.serve.app import SHUTDOWN_AFTER_DRAIN_S
from proxy.serve.metrics import Metrics
from tests.conftest import PROXY_START_S
from tests.llama import debian_tool
from tests.serve.test_metrics import BOARD_SAMPLE, every_family_record

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
HEALTHCHECK_SCRIPT = DOCKER / "healthcheck.py"


# -- parsing helpers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: keyword, leading --flags, the rest, and its stage index."""

    keyword: str
    flags: tuple[str, ...]
    args: str
    stage: int

    def exec_form(self) -> list[str] | None:
        """The JSON-array arguments, or None for the shell form."""
        if not self.args.startswith("["):
            return None
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self.args
        return value

    def flag(self, name: str) -> str | None:
        """The value of ``--name=value``, if given."""
        for item in self.flags:
            key, _, value = item.partition("=")
            if key == f"--{name}":
                return value
        return None


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions of ``text``: comments dropped, ``\\`` continuations joined."""
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue  # comments (and parser directives) vanish, even inside continuations
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    assert not buf, "Dockerfile ends inside a line continuation"
    out: list[Instruction] = []
    stage = -1
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        flags: list[str] = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, tuple(flags), rest, stage))
    return out


def go_duration_s(value: object) -> float:
    """Seconds in a compose duration such as ``45s``, ``1m30s`` or ``1h``."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    text = str(value)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|ns)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def argv(command: object) -> list[str]:
    """A compose ``command``/``test`` as a list (compose also accepts one shell-style string)."""
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list)
    return [str(c) for c in command]


def flag_value(args: list[str], flag: str) -> str:
    """The value that follows ``flag`` in ``args``."""
    assert flag in args, f"{flag} missing from {args}"
    return args[args.index(flag) + 1]


def host_port(url: str) -> tuple[str, int]:
    """(host, port) of an http URL, the port defaulted."""
    parts = urlsplit(url)
    assert parts.hostname is not None, url
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


# -- the files ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile((DOCKER / "Dockerfile").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def final(dockerfile: list[Instruction]) -> dict[str, list[Instruction]]:
    """The final stage's instructions by keyword."""
    last = max(i.stage for i in dockerfile)
    by: dict[str, list[Instruction]] = {}
    for inst in dockerfile:
        if inst.stage == last:
            by.setdefault(inst.keyword, []).append(inst)
    return by


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    value = compose["services"]
    assert isinstance(value, dict)
    return value


@pytest.fixture(scope="module")
def proxy_cmd(services: dict[str, Any]) -> list[str]:
    return argv(services["timing-proxy"]["command"])


@pytest.fixture(scope="module")
def llama_cmd(services: dict[str, Any]) -> list[str]:
    return argv(services["llama-server"]["command"])


def image_cmd(final: dict[str, list[Instruction]]) -> list[str]:
    (cmd,) = final["CMD"]
    args = cmd.exec_form()
    assert args is not None, "CMD must be in exec form"
    return args


def healthcheck_url(test: list[str]) -> str:
    """The URL that a ``python healthcheck.py URL`` check probes."""
    urls = [a for a in test if a.startswith(("http://", "https://"))]
    assert len(urls) == 1, test
    return urls[0]


def listen_port(args: list[str]) -> int:
    return parse_listen(flag_value(args, "--listen"))[1]


def admin_port(args: list[str]) -> int:
    """The admin listener's port (``/stats``, ``/metrics``, ``/dashboard``)."""
    return parse_listen(flag_value(args, "--admin-listen"))[1]


def token_variable(args: list[str]) -> str | None:
    """The environment variable the command takes the admin token from, if it names one."""
    return flag_value(args, "--admin-token-env") if "--admin-token-env" in args else None


ADMIN_TOKEN = "docker-test-token"
"""The admin token the tests give a container, as ``docker run -e`` would."""


# -- compose.yaml ------------------------------------------------------------------------------


def test_compose_defines_llama_server_and_proxy(services: dict[str, Any]) -> None:
    """compose.yaml has a llama-server service and a timing-proxy service."""
    assert {"llama-server", "timing-proxy"} <= set(services)


def test_proxy_upstream_is_the_llama_server_service(
    proxy_cmd: list[str], llama_cmd: list[str]
) -> None:
    """The proxy's --upstream names the llama-server service and the port llama-server uses."""
    host, port = host_port(flag_value(proxy_cmd, "--upstream"))
    assert host == "llama-server"
    assert port == int(flag_value(llama_cmd, "--port"))


def test_llama_server_serves_metrics_on_all_interfaces(llama_cmd: list[str]) -> None:
    """llama-server runs with --metrics (merged into the proxy's /metrics) on 0.0.0.0."""
    assert "--metrics" in llama_cmd
    assert flag_value(llama_cmd, "--host") == "0.0.0.0"


def test_llama_server_healthcheck_probes_its_port(
    services: dict[str, Any], llama_cmd: list[str]
) -> None:
    """llama-server's healthcheck GETs /health on the port given by its --port."""
    test = argv(services["llama-server"]["healthcheck"]["test"])
    url = healthcheck_url(test)
    assert urlsplit(url).path == "/health"
    assert host_port(url)[1] == int(flag_value(llama_cmd, "--port"))


def test_proxy_waits_for_a_healthy_llama_server(services: dict[str, Any]) -> None:
    """The proxy starts only once llama-server's healthcheck passes."""
    depends = services["timing-proxy"]["depends_on"]
    assert depends["llama-server"]["condition"] == "service_healthy"


def test_published_port_matches_listen_and_expose(
    services: dict[str, Any], proxy_cmd: list[str], final: dict[str, list[Instruction]]
) -> None:
    """The proxy's published container ports are its --listen and --admin-listen ports, and
    the image's EXPOSE."""
    ports = {listen_port(proxy_cmd), admin_port(proxy_cmd)}
    assert len(ports) == 2
    published = services["timing-proxy"]["ports"]
    targets = {int(str(p).rsplit(":", 1)[1].split("/")[0]) for p in published}
    assert targets == ports and len(published) == 2
    exposed = {p.split("/")[0] for inst in final["EXPOSE"] for p in inst.args.split()}
    assert exposed == {str(port) for port in ports}


def test_proxy_listens_on_all_interfaces_but_publishes_on_loopback(
    services: dict[str, Any], proxy_cmd: list[str]
) -> None:
    """Inside the container both listeners bind 0.0.0.0; the host publishes them on
    127.0.0.1 only."""
    for flag in ("--listen", "--admin-listen"):
        assert parse_listen(flag_value(proxy_cmd, flag))[0] == "0.0.0.0"
    for published in services["timing-proxy"]["ports"]:
        assert str(published).startswith("127.0.0.1:")


def test_stop_grace_period_exceeds_the_drain_time(
    services: dict[str, Any], proxy_cmd: list[str], final: dict[str, list[Instruction]]
) -> None:
    """Docker waits longer than the proxy may take to exit (shutdown_drain_s, then
    SHUTDOWN_AFTER_DRAIN_S, then the span export's bound) before SIGKILL, so streams get
    the whole drain and the cut ones' records are written."""
    # the container loads the repository's config.toml, copied to the path --config names
    copies = {tuple(inst.args.split()) for inst in final["COPY"]}
    assert ("config.toml", flag_value(proxy_cmd, "--config")) in copies
    config = load_config(ROOT / "config.toml")
    grace = go_duration_s(services["timing-proxy"]["stop_grace_period"])
    exit_within = (
        config.server.shutdown_drain_s + SHUTDOWN_AFTER_DRAIN_S + config.otel.export_timeout_s
    )
    assert grace > exit_within


@pytest.mark.parametrize("name", ["Dockerfile", "compose.yaml", "README.md"])
def test_the_deployment_files_state_the_configs_drain(name: str) -> None:
    """Where docker/'s files state the drain or the time after it, they state the image's
    config.toml's shutdown_drain_s and the proxy's SHUTDOWN_AFTER_DRAIN_S."""
    config = load_config(ROOT / "config.toml")
    text = " ".join((DOCKER / name).read_text(encoding="utf-8").replace("#", " ").split())
    drains = re.findall(r"shutdown_drain_s`? \((\d+(?:\.\d+)?) s", text)
    assert drains, f"{name} does not state the drain"
    assert {float(d) for d in drains} == {config.server.shutdown_drain_s}
    after = re.findall(r"(\d+(?:\.\d+)?) s after (?:the drain|it)", text)
    assert {float(a) for a in after} <= {SHUTDOWN_AFTER_DRAIN_S}


def test_sigterm_reaches_the_proxy_directly(
    services: dict[str, Any], final: dict[str, list[Instruction]]
) -> None:
    """The proxy is PID 1 (exec-form ENTRYPOINT, no init) and is stopped with SIGTERM."""
    (entrypoint,) = final["ENTRYPOINT"]
    assert entrypoint.exec_form() == ["timing-proxy"]
    assert [i.args for i in final["STOPSIGNAL"]] == ["SIGTERM"]
    proxy = services["timing-proxy"]
    assert proxy["init"] is False
    assert proxy.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert "entrypoint" not in proxy


def test_compose_command_is_the_image_cmd(
    proxy_cmd: list[str], final: dict[str, list[Instruction]]
) -> None:
    """compose.yaml spells out the image's own CMD, so both start the same proxy."""
    assert proxy_cmd == image_cmd(final)


# -- Dockerfile --------------------------------------------------------------------------------


def test_dockerfile_cmd_is_exec_form_serve(final: dict[str, list[Instruction]]) -> None:
    """The image's CMD is a JSON array that runs the serve subcommand."""
    assert image_cmd(final)[0] == "serve"


def test_final_stage_runs_as_non_root(final: dict[str, list[Instruction]]) -> None:
    """The final stage switches to a non-root user (uid 10001) before it starts anything."""
    user = final["USER"][-1].args.split(":")[0]
    assert user not in ("root", "0")
    assert user == "10001"


def test_image_is_multi_stage_on_slim_python(dockerfile: list[Instruction]) -> None:
    """A builder stage and a final stage, both on the same slim Python that pyproject allows."""
    froms = [i.args.split()[0] for i in dockerfile if i.keyword == "FROM"]
    assert len(froms) == 2 and froms[0] == froms[1]
    assert froms[0] == "python:${PYTHON_VERSION}-slim"
    (arg,) = [i for i in dockerfile if i.keyword == "ARG" and i.stage == -1]
    name, _, version = arg.args.partition("=")
    assert name == "PYTHON_VERSION"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    minimum = pyproject["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, version.split("."))) >= tuple(map(int, minimum.split(".")))
    assert not any(i.flag("platform") for i in dockerfile), "no per-architecture stage"


def test_version_label_matches_pyproject(final: dict[str, list[Instruction]]) -> None:
    """The image's version label defaults to the project's version in pyproject.toml."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    args = {name: value for name, _, value in (i.args.partition("=") for i in final["ARG"])}
    assert args["VERSION"] == pyproject["project"]["version"]
    labels = " ".join(i.args for i in final["LABEL"])
    assert 'org.opencontainers.image.version="${VERSION}"' in labels


def test_build_context_filter_lets_in_what_the_build_copies(dockerfile: list[Instruction]) -> None:
    """Dockerfile.dockerignore excludes everything but the files the Dockerfile copies."""
    lines = [
        ln.strip()
        for ln in (DOCKER / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    ]
    patterns = [ln for ln in lines if ln and not ln.startswith("#")]
    assert patterns[0] == "*"
    allowed = {p[1:] for p in patterns if p.startswith("!")}
    sources = [
        src
        for inst in dockerfile
        if inst.keyword == "COPY" and not inst.flag("from")
        for src in inst.args.split()[:-1]
    ]
    for src in sources:
        if src != ".":
            assert src in allowed or src.split("/")[0] in allowed, src
    # what `pip wheel .` reads
    assert {"pyproject.toml", "proxy"} <= allowed
    assert not allowed & {".venv", ".git", "tests", "bench"}


def test_healthchecks_probe_the_admin_port(
    services: dict[str, Any], proxy_cmd: list[str], final: dict[str, list[Instruction]]
) -> None:
    """The image's and compose's proxy healthchecks run the copied script on the admin
    listener's /stats (the agent's port relays /stats to llama-server)."""
    port = admin_port(proxy_cmd)
    (check,) = final["HEALTHCHECK"]
    keyword, _, rest = check.args.partition(" ")
    assert keyword == "CMD"
    image_test = json.loads(rest)
    compose_test = argv(services["timing-proxy"]["healthcheck"]["test"])
    assert compose_test[0] == "CMD"
    copied = {
        inst.args.split()[-1]
        for inst in final["COPY"]
        if inst.args.split()[0] == "docker/healthcheck.py"
    }
    for test in (image_test, compose_test[1:]):
        assert test[0] == "python" and test[1] in copied
        url = healthcheck_url(test)
        assert host_port(url) == ("127.0.0.1", port)
        assert urlsplit(url).path == "/stats"
    # the script gives up before Docker would kill it
    script_timeout = float(
        re.findall(r"^TIMEOUT_S = ([\d.]+)", HEALTHCHECK_SCRIPT.read_text(encoding="utf-8"), re.M)[
            0
        ]
    )
    timeouts = [check.flag("timeout"), services["timing-proxy"]["healthcheck"]["timeout"]]
    assert all(script_timeout < go_duration_s(t) for t in timeouts)


@pytest.mark.parametrize("source", ["compose", "image"])
def test_command_line_is_accepted_by_the_cli(
    source: str, proxy_cmd: list[str], final: dict[str, list[Instruction]]
) -> None:
    """The real CLI parser and config loader accept the proxy's container command line."""
    from proxy.commands.cli import serve_config  # here: the module loads without it

    cmd = proxy_cmd if source == "compose" else image_cmd(final)
    args = build_parser().parse_args(cmd)  # exits (SystemExit) on an unknown flag
    assert args.command == "serve"
    args.config = str(ROOT / "config.toml")  # the file the image copies to --config's path
    variable = token_variable(cmd)
    config = serve_config(args, {variable: ADMIN_TOKEN} if variable else {})
    assert config.upstream.url == "http://llama-server:8080"
    assert config.admin.listen == "0.0.0.0:8082"


@pytest.mark.parametrize("source", ["compose", "image"])
def test_an_admin_listener_beyond_loopback_wants_a_token_from_the_environment(
    source: str, proxy_cmd: list[str], services: dict[str, Any], final: dict[str, list[Instruction]]
) -> None:
    """The container's admin listener binds beyond loopback, so its command line takes the
    admin token from an environment variable and refuses to start without one; with it,
    the only start-up warning left is the agent's port (which a container must bind on
    0.0.0.0). compose.yaml requires that variable (``${VAR:?...}``) for the proxy."""
    from proxy.commands.cli import serve_config
    from proxy.serve.exposure import is_loopback, startup_warnings

    cmd = proxy_cmd if source == "compose" else image_cmd(final)
    args = build_parser().parse_args(cmd)
    args.config = str(ROOT / "config.toml")
    assert not is_loopback(parse_listen(args.admin_listen)[0])
    variable = token_variable(cmd)
    assert variable is not None, "the admin listener would start without a token"
    with pytest.raises(ConfigError, match=f"--admin-token-env {variable}: the variable is unset"):
        serve_config(args, {})
    config = serve_config(args, {variable: ADMIN_TOKEN})
    assert config.admin.auth_token == ADMIN_TOKEN
    assert [w.event for w in startup_warnings(config)] == ["agent_listener_exposed"]
    environment = services["timing-proxy"]["environment"]
    assert re.fullmatch(rf"\$\{{{variable}:\?[^}}]+\}}", environment[variable])


def test_prometheus_sends_the_admin_token(proxy_cmd: list[str], services: dict[str, Any]) -> None:
    """Prometheus scrapes with the admin token as a bearer token, read from the secret that
    compose.yaml mounts into its service (readable by its user, nobody) and fills from the
    variable the proxy takes its token from."""
    doc = yaml.safe_load((DOCKER / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = doc["scrape_configs"]
    auth = job["authorization"]
    assert auth.get("type", "Bearer") == "Bearer"
    folder, _, name = auth["credentials_file"].rpartition("/")
    assert folder == "/run/secrets"
    mounts = {m["source"]: m for m in services["prometheus"]["secrets"]}
    assert mounts[name].get("target", name) == name
    assert mounts[name]["mode"] == 0o444
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))
    assert compose["secrets"][name] == {"environment": token_variable(proxy_cmd)}


# -- prometheus.yml ----------------------------------------------------------------------------


def test_prometheus_scrapes_only_the_proxy(proxy_cmd: list[str]) -> None:
    """Prometheus scrapes the proxy service's /metrics on its admin port, and nothing else."""
    doc = yaml.safe_load((DOCKER / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "timing-proxy"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"timing-proxy:{admin_port(proxy_cmd)}"]
    assert go_duration_s(doc["global"]["scrape_interval"]) == 15


def test_prometheus_service_is_optional(services: dict[str, Any]) -> None:
    """The prometheus service only starts with the monitoring profile and mounts prometheus.yml."""
    prom = services["prometheus"]
    assert prom["profiles"] == ["monitoring"]
    assert any(str(v).startswith("./prometheus.yml:") for v in prom["volumes"])


# -- healthcheck.py and the image's command line, run here -------------------------------------


def run_healthcheck(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT), url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("status", "healthy"),
    [(200, True), (204, True), (401, True), (403, False), (404, False), (500, False), (503, False)],
)
async def test_healthcheck_script_status(aiohttp_server: Any, status: int, healthy: bool) -> None:
    """healthcheck.py exits 0 for a 2xx or a 401 answer and 1 for any other status."""

    async def stats(request: web.Request) -> web.Response:
        return web.Response(status=status)

    app = web.Application()
    app.router.add_get("/stats", stats)
    server = await aiohttp_server(app)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HEALTHCHECK_SCRIPT),
        str(server.make_url("/stats")),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == (0 if healthy else 1), out
    assert f"HTTP {status}" in out.decode()


def test_healthcheck_script_fails_when_nothing_listens() -> None:
    """healthcheck.py exits 1 when the port refuses the connection."""
    done = run_healthcheck(f"http://127.0.0.1:{free_port()}/stats")
    assert done.returncode == 1
    assert done.stdout.startswith("unhealthy:")


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    admin_url: str
    stderr: Path


def _wait_listening(proc: subprocess.Popen[bytes], ports: tuple[int, ...], stderr: Path) -> None:
    """Wait until ``proc`` accepts connections on each of ``ports`` on loopback."""
    deadline = time.monotonic() + PROXY_START_S
    for port in ports:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, stderr.read_text()
                assert time.monotonic() < deadline, "proxy did not start"
                time.sleep(0.05)


def image_invocation(
    final: dict[str, list[Instruction]], tmp_path: Path, config_text: str | None, token: str | None
) -> tuple[list[str], dict[str, str], int, int]:
    """The image's CMD as run here: its listeners moved to free loopback ports, an upstream
    where nothing listens, ``config_text`` (or the repository's config.toml, the file the
    image copies) as its config; the image's ENV, and the admin token in its variable as
    ``docker run -e`` would set it (none: unset). The command, the environment, the ports."""
    cmd = image_cmd(final)
    port, admin = free_port(), free_port()
    cmd[cmd.index("--listen") + 1] = f"127.0.0.1:{port}"
    cmd[cmd.index("--admin-listen") + 1] = f"127.0.0.1:{admin}"
    # nothing listens upstream: /stats must not depend on llama-server
    cmd[cmd.index("--upstream") + 1] = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "config.toml"
    if config_text is None:
        shutil.copyfile(ROOT / "config.toml", config)
    else:
        config.write_text(config_text, encoding="utf-8")
    cmd[cmd.index("--config") + 1] = str(config)
    env = dict(os.environ)
    for inst in final["ENV"]:
        for item in shlex.split(inst.args):
            key, _, value = item.partition("=")
            if key != "PATH":
                env[key] = value
    variable = token_variable(cmd)
    if variable is not None:
        env.pop(variable, None)
        if token is not None:
            env[variable] = token
    return cmd, env, port, admin


@pytest.fixture
def serve_image_cmd(final: dict[str, list[Instruction]], tmp_path: Path) -> Iterator[Any]:
    """Start the image's CMD here, as ``python -m proxy``, with the image's ENV."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(config_text: str | None = None) -> Served:
        cmd, env, port, admin = image_invocation(final, tmp_path, config_text, ADMIN_TOKEN)
        stderr = tmp_path / "stderr.txt"
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "proxy", *cmd],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        procs.append(proc)
        _wait_listening(proc, (port, admin), stderr)
        return Served(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", stderr)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_image_cmd_serves_is_healthy_and_stops_on_sigterm(
    serve_image_cmd: Any, final: dict[str, list[Instruction]]
) -> None:
    """The image's command line, given its admin token, serves /stats on its admin listener
    to a caller with the token (401 without), passes the healthcheck (which has none) and
    exits 0 on SIGTERM."""
    served: Served = serve_image_cmd()
    (check,) = final["HEALTHCHECK"]
    image_url = healthcheck_url(json.loads(check.args.partition(" ")[2]))
    url = served.admin_url + urlsplit(image_url).path
    done = run_healthcheck(url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "HTTP 401" in done.stdout
    authorized = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(authorized, timeout=5) as page:
        assert page.status == 200
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=15) == 0, served.stderr.read_text()
    assert run_healthcheck(url).returncode == 1


def test_image_cmd_without_its_token_refuses_to_start(
    final: dict[str, list[Instruction]], tmp_path: Path
) -> None:
    """The image's command line without the admin token's variable exits 2 before
    listening, with one ``timing-proxy: error:`` line naming the variable."""
    cmd, env, _, _ = image_invocation(final, tmp_path, None, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the image's command line started without an admin token")
    (line,) = err.decode().splitlines()
    assert proc.returncode == 2
    assert line.startswith("timing-proxy: error: --admin-token-env TIMING_PROXY_ADMIN_TOKEN:")


def test_healthcheck_counts_401_as_alive(serve_image_cmd: Any) -> None:
    """With an admin auth token configured, /stats answers 401 and the healthcheck still
    passes."""
    served: Served = serve_image_cmd('[admin]\nauth_token = "docker-test-token"\n')
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(served.admin_url + "/stats", timeout=5)
    assert refused.value.code == 401
    refused.value.close()
    done = run_healthcheck(served.admin_url + "/stats")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "HTTP 401" in done.stdout


# -- docker compose config ---------------------------------------------------------------------


def compose_cli() -> list[str] | None:
    """A Compose v2+ command line (``docker compose`` or ``docker-compose``), or None."""
    candidates: list[list[str]] = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    standalone = shutil.which("docker-compose") or shutil.which(
        "docker-compose", path=str(Path(sys.executable).parent)
    )
    if standalone:
        candidates.append([standalone])
    for cli in candidates:
        try:
            done = subprocess.run(
                [*cli, "version", "--short"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except OSError:
            continue
        major = re.match(r"v?(\d+)\.", done.stdout.strip())
        if done.returncode == 0 and major and int(major.group(1)) >= 2:
            return cli
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    """``docker compose config`` (no engine needed) parses and validates compose.yaml."""
    cli = compose_cli()
    if cli is None:
        pytest.skip("no Compose v2+ CLI (docker compose / docker-compose) on this machine")
    env = {k: v for k, v in os.environ.items() if k not in ("MODELS_DIR", "LLAMA_MODEL")}
    env["TIMING_PROXY_ADMIN_TOKEN"] = ADMIN_TOKEN  # compose.yaml requires it
    done = subprocess.run(
        [
            *cli,
            "-f",
            str(DOCKER / "compose.yaml"),
            "--profile",
            "monitoring",
            "config",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    rendered = json.loads(done.stdout)
    assert set(rendered["services"]) == {"llama-server", "timing-proxy", "prometheus", "grafana"}
    proxy = rendered["services"]["timing-proxy"]
    assert Path(proxy["build"]["context"]) == ROOT
    assert proxy["build"]["dockerfile"] == "docker/Dockerfile"
    assert rendered["services"]["llama-server"]["command"][0] == "-m"
    assert rendered["services"]["llama-server"]["command"][1].startswith("/models/")


# -- Grafana: provisioning and the dashboard ---------------------------------------------------

GRAFANA = DOCKER / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "timing-proxy.json"

PROMTOOL = os.environ.get("TIMING_PROXY_PROMTOOL", "/usr/bin/promtool")
"""Prometheus's own tool (Debian package ``prometheus``): its rule unit tests evaluate PromQL
with Prometheus's engine."""
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*([A-Za-z_]\w*)\s*\)$", re.S)
_GRAFANA_VARIABLE = re.compile(r"\$\{?(\w+)\}?")


def grafana_query(variable: dict[str, Any]) -> str:
    """The PromQL of a query variable: ``label_values(EXPR, label)`` gives EXPR."""
    query = variable["query"]
    text = query["query"] if isinstance(query, dict) else query
    assert isinstance(text, str)
    found = _LABEL_VALUES.match(text.strip())
    return found.group(1) if found else text


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def dashboard_queries(doc: dict[str, Any]) -> list[str]:
    """Every PromQL of the dashboard: panel targets and the query variables."""
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [grafana_query(v) for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


@pytest.fixture(scope="module")
def provisioned_datasource() -> dict[str, Any]:
    doc = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text(encoding="utf-8")
    )
    (source,) = doc["datasources"]
    assert isinstance(source, dict)
    return source


FLEET_ROBOT = "arm-3"


@pytest.fixture(scope="module")
def proxy_page_series() -> list[tuple[str, dict[str, str]]]:
    """(sample name, labels) of every series on a real /metrics page of the proxy: a Metrics
    with a fleet label, fed a record that touches every family and a failed one, rendered
    with every board gauge."""
    metrics = Metrics({"robot": FLEET_ROBOT})
    metrics.observe(every_family_record(0))
    failed = every_family_record(1)
    metrics.observe(dataclasses.replace(failed, status=500, outcome=Outcome.UPSTREAM_ERROR))
    page = metrics.render(None, BOARD_SAMPLE).decode()
    return [
        (sample.name, dict(sample.labels))
        for family in text_string_to_metric_families(page)
        for sample in family.samples
    ]


def _series(name: str, labels: dict[str, str]) -> str:
    """A series in Prometheus's notation (label values as quoted strings)."""
    inner = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def promtool_selects(
    queries: list[str],
    series: list[tuple[str, dict[str, str]]],
    variables: dict[str, str],
    tmp: Path,
) -> subprocess.CompletedProcess[str]:
    """``promtool test rules`` evaluating each query, its Grafana variables set to
    ``variables``, over ``series`` (each rising by one a minute for 20 minutes): the run
    passes when every query parses and returns at least one series at the end."""
    every = {"__rate_interval": "5m", "__range": "10m", **variables}
    tests = [
        {
            "expr": f"count({_GRAFANA_VARIABLE.sub(lambda m: every[m.group(1)], q)}) > bool 0",
            "eval_time": "20m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        }
        for q in queries
    ]
    unit = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": _series(name, labels), "values": "0+1x20"} for name, labels in series
                ],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp / "dashboard_test.yml"
    path.write_text(json.dumps(unit), encoding="utf-8")  # JSON is YAML
    return subprocess.run(
        [debian_tool(PROMTOOL, "prometheus"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def page_variables(series: list[tuple[str, dict[str, str]]]) -> dict[str, str]:
    """The dashboard's variables set to what the page's request counter carries."""
    labels = next(lb for name, lb in series if name == "timing_proxy_requests_total")
    return {"robot": labels["robot"], "model": labels["model"], "kind": labels["kind"]}


def test_grafana_datasource_is_the_compose_prometheus(
    services: dict[str, Any], provisioned_datasource: dict[str, Any]
) -> None:
    """The provisioned datasource is a Prometheus at the compose prometheus service's port,
    and its minimum interval is Prometheus's scrape interval."""
    source = provisioned_datasource
    assert source["type"] == "prometheus"
    host, port = host_port(source["url"])
    assert host == "prometheus" and "prometheus" in services
    published = [str(p).rsplit(":", 1)[-1] for p in services["prometheus"]["ports"]]
    assert published == [str(port)]
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text(encoding="utf-8"))
    interval = scrape["global"]["scrape_interval"]
    assert go_duration_s(source["jsonData"]["timeInterval"]) == go_duration_s(interval)


def test_grafana_service_provisions_the_dashboard(services: dict[str, Any]) -> None:
    """The grafana service (monitoring profile) mounts the provisioning folder where Grafana
    reads it and the dashboards folder where the file provider looks; its home dashboard is
    the file in that folder."""
    grafana = services["grafana"]
    assert grafana["profiles"] == ["monitoring"]
    mounts = {}
    for volume in grafana["volumes"]:
        source, target, *_ = str(volume).split(":")
        mounts[source] = target
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    for source in ("./grafana/provisioning", "./grafana/dashboards"):
        assert (DOCKER / source).is_dir(), source
    provider_file = GRAFANA / "provisioning" / "dashboards" / "timing-proxy.yaml"
    (provider,) = yaml.safe_load(provider_file.read_text(encoding="utf-8"))["providers"]
    assert provider["type"] == "file"
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{provider['options']['path']}/{DASHBOARD.name}"
    assert grafana["depends_on"] == {"prometheus": {"condition": "service_started"}}
    (published,) = grafana["ports"]
    assert str(published).startswith("127.0.0.1:")


def test_dashboard_structure(
    dashboard: dict[str, Any], provisioned_datasource: dict[str, Any]
) -> None:
    """The dashboard JSON is one Grafana can provision: a uid, unique panel ids, panels on
    the 24-column grid without overlap, and every non-row panel with PromQL targets (unique
    refIds) on the provisioned datasource, as are the query variables."""
    uid = provisioned_datasource["uid"]
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
        mine = {
            (grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["title"] and p["targets"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": uid}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for target in p["targets"]:
            assert target["expr"].strip(), p["title"]
            assert target.get("datasource", p["datasource"])["uid"] == uid, p["title"]
    variables = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} >= {"robot", "model", "kind"}
    assert all(v["datasource"]["uid"] == uid for v in variables)


def test_every_query_selects_series_of_the_page(
    dashboard: dict[str, Any],
    proxy_page_series: list[tuple[str, dict[str, str]]],
    tmp_path: Path,
) -> None:
    """Prometheus's own engine (``promtool test rules``), over every series of the proxy's
    /metrics page, returns series for every query of the dashboard with its variables set to
    the page's robot, model and kind: every metric, function and matched label exists."""
    queries = dashboard_queries(dashboard)
    assert queries
    variables = page_variables(proxy_page_series)
    assert variables["robot"] == FLEET_ROBOT
    run = promtool_selects(queries, proxy_page_series, variables, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    "query",
    [
        'sum(rate(timing_proxy_request_total{robot=~"$robot"}[$__rate_interval]))',
        "histogram_quantil(0.5, sum by (le) (rate(timing_proxy_prefill_seconds_bucket[5m])))",
        'sum(rate(timing_proxy_requests_total{robot=~"$robot",board="orin"}[$__rate_interval]))',
    ],
    ids=["misspelt-metric", "misspelt-function", "label-the-series-lack"],
)
def test_the_promtool_check_fails_a_wrong_query(
    query: str, proxy_page_series: list[tuple[str, dict[str, str]]], tmp_path: Path
) -> None:
    """A misspelt metric, a misspelt function, or a label the page's series do not carry
    fails the check that passes the dashboard's own queries."""
    variables = page_variables(proxy_page_series)
    run = promtool_selects([query], proxy_page_series, variables, tmp_path)
    assert run.returncode != 0, run.stdout


def test_the_panels_a_robot_team_needs(dashboard: dict[str, Any]) -> None:
    """The dashboard reads TTFT and tool-call time, the prefill/decode split, schema prefill
    paid vs saved, the cache split, busted caches (schemas prefilled again, prefill lost by
    cause), draft acceptance, image tokens and the board's power and energy."""
    needed = {
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "timing_proxy_tool_call_seconds_bucket",
        "timing_proxy_prefill_seconds_sum",
        "timing_proxy_decode_seconds_sum",
        "timing_proxy_schema_prefill_seconds_total",
        "timing_proxy_prompt_tokens_by_cache_total",
        "timing_proxy_schema_prefilled_again_total",
        "timing_proxy_prefill_lost_seconds_total",
        "timing_proxy_draft_acceptance_ratio_bucket",
        "timing_proxy_image_tokens_sum",
        "timing_proxy_board_power_watts",
        "timing_proxy_request_energy_joules_bucket",
    }
    by = " ".join(dashboard_queries(dashboard))
    used = {name for name in needed if re.search(rf"\b{re.escape(name)}\{{", by)}
    assert needed <= used, sorted(needed - used)
    assert re.search(r"schema_prefill_seconds_total\{[^}]*\}\[[^\]]*\]\)\)", by)
    assert "sum by (state)" in by and "sum by (cause)" in by
    assert re.search(r"by \(le, model, kind\) \(rate\(gen_ai_server_time_to_first_token", by)
