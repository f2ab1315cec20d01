"""Consistency of the deployment files in docker/ with each other and with the proxy.

No image is built or run here (no Docker engine in CI): these tests read docker/Dockerfile,
docker/compose.yaml and docker/prometheus.yml, check that the ports, names, flags and timings
they state agree, feed the image's command line to the real CLI parser, and run that command
line (with the listen address moved to loopback) and docker/healthcheck.py on this machine.
``docker compose config`` validates compose.yaml where a compose CLI is installed.
"""

from __future__ import annotations

import asyncio
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

from proxy.commands.cli import _parser
from proxy.commands.ports import free_port
from proxy.config import load_config, parse_listen

ROOT = Path(__file__).resolve().parents[1]
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
    """The proxy's published container port is its --listen port and the image's EXPOSE."""
    port = listen_port(proxy_cmd)
    (published,) = services["timing-proxy"]["ports"]
    target = str(published).rsplit(":", 1)[1].split("/")[0]
    assert int(target) == port
    exposed = {p.split("/")[0] for inst in final["EXPOSE"] for p in inst.args.split()}
    assert exposed == {str(port)}


def test_proxy_listens_on_all_interfaces_but_publishes_on_loopback(
    services: dict[str, Any], proxy_cmd: list[str]
) -> None:
    """Inside the container the proxy binds 0.0.0.0; the host publishes it on 127.0.0.1 only."""
    assert parse_listen(flag_value(proxy_cmd, "--listen"))[0] == "0.0.0.0"
    (published,) = services["timing-proxy"]["ports"]
    assert str(published).startswith("127.0.0.1:")


def test_stop_grace_period_exceeds_the_drain_time(
    services: dict[str, Any], proxy_cmd: list[str], final: dict[str, list[Instruction]]
) -> None:
    """Docker waits longer than shutdown_drain_s before SIGKILL, so streams can drain."""
    # the container loads the repository's config.toml, copied to the path --config names
    copies = {tuple(inst.args.split()) for inst in final["COPY"]}
    assert ("config.toml", flag_value(proxy_cmd, "--config")) in copies
    config = load_config(ROOT / "config.toml")
    grace = go_duration_s(services["timing-proxy"]["stop_grace_period"])
    assert grace > config.server.shutdown_drain_s


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


def test_healthchecks_probe_the_listen_port(
    services: dict[str, Any], proxy_cmd: list[str], final: dict[str, list[Instruction]]
) -> None:
    """The image's and compose's proxy healthchecks run the copied script on the listen port."""
    port = listen_port(proxy_cmd)
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
    cmd = proxy_cmd if source == "compose" else image_cmd(final)
    args = _parser().parse_args(cmd)  # exits (SystemExit) on an unknown flag
    assert args.command == "serve"
    host, port = parse_listen(args.listen)
    config = load_config(
        ROOT / "config.toml",
        {"server": {"host": host, "port": port}, "upstream": {"url": args.upstream}},
    )
    assert config.upstream.url == "http://llama-server:8080"


# -- prometheus.yml ----------------------------------------------------------------------------


def test_prometheus_scrapes_only_the_proxy(proxy_cmd: list[str]) -> None:
    """Prometheus scrapes the proxy service's /metrics on its listen port, and nothing else."""
    doc = yaml.safe_load((DOCKER / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == "timing-proxy"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"timing-proxy:{listen_port(proxy_cmd)}"]
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
    stderr: Path


@pytest.fixture
def serve_image_cmd(final: dict[str, list[Instruction]], tmp_path: Path) -> Iterator[Any]:
    """Start the image's CMD here, as ``python -m proxy``, with the image's ENV."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(config_text: str | None = None) -> Served:
        cmd = image_cmd(final)
        port = free_port()
        cmd[cmd.index("--listen") + 1] = f"127.0.0.1:{port}"
        # nothing listens upstream: /stats must not depend on llama-server
        cmd[cmd.index("--upstream") + 1] = f"http://127.0.0.1:{free_port()}"
        config = tmp_path / "config.toml"
        if config_text is None:
            shutil.copyfile(ROOT / "config.toml", config)  # the file the image copies
        else:
            config.write_text(config_text, encoding="utf-8")
        cmd[cmd.index("--config") + 1] = str(config)
        env = dict(os.environ)
        for inst in final["ENV"]:
            for item in shlex.split(inst.args):
                key, _, value = item.partition("=")
                if key != "PATH":
                    env[key] = value
        stderr = tmp_path / "stderr.txt"
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "proxy", *cmd],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert proc.poll() is None, stderr.read_text()
                assert time.monotonic() < deadline, "proxy did not start"
                time.sleep(0.05)
        return Served(proc, url, stderr)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_image_cmd_serves_is_healthy_and_stops_on_sigterm(
    serve_image_cmd: Any, final: dict[str, list[Instruction]]
) -> None:
    """The image's command line serves /stats, passes the healthcheck and exits 0 on SIGTERM."""
    served: Served = serve_image_cmd()
    (check,) = final["HEALTHCHECK"]
    image_url = healthcheck_url(json.loads(check.args.partition(" ")[2]))
    url = served.url + urlsplit(image_url).path
    done = run_healthcheck(url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "HTTP 200" in done.stdout
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=15) == 0, served.stderr.read_text()
    assert run_healthcheck(url).returncode == 1


def test_healthcheck_counts_401_as_alive(serve_image_cmd: Any) -> None:
    """With an auth token configured, /stats answers 401 and the healthcheck still passes."""
    served: Served = serve_image_cmd('[server]\nauth_token = "docker-test-token"\n')
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(served.url + "/stats", timeout=5)
    assert refused.value.code == 401
    refused.value.close()
    done = run_healthcheck(served.url + "/stats")
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
    assert set(rendered["services"]) == {"llama-server", "timing-proxy", "prometheus"}
    proxy = rendered["services"]["timing-proxy"]
    assert Path(proxy["build"]["context"]) == ROOT
    assert proxy["build"]["dockerfile"] == "docker/Dockerfile"
    assert rendered["services"]["llama-server"]["command"][0] == "-m"
    assert rendered["services"]["llama-server"]["command"][1].startswith("/models/")
