"""Start each path in front of the fake upstream: timing-proxy and the bare aiohttp relay
(``bench/overhead``'s launchers), and the peers, each from its own install
(``bench.peers.install``), listening on 127.0.0.1 only, logs off or to /dev/null, with its
stderr kept in the run's temp dir for the reason of a failure."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.overhead.constants import BARE, HOST
from bench.overhead.processes import Proc, start_proxy, start_reference
from bench.peers.install import PeerUnavailable, ensure_npm, ensure_venv
from proxy.commands.ports import free_port

LITELLM_REQUIREMENT = "litellm[proxy]==1.108.7"
KVPROF_REQUIREMENT = "kvprof==0.2.0"
MITMPROXY_REQUIREMENT = "mitmproxy==11.0.2"
PORTKEY_PACKAGE, PORTKEY_VERSION = "@portkey-ai/gateway", "1.15.2"
PORTKEY_OVERRIDES = {"@hono/node-server": "1.13.8"}
"""The gateway's ``^1.3.3`` range resolves to a current ``@hono/node-server``, with which it
fails every streamed chat request (HTTP 500, ``TypeError: immutable`` in its
``updateHeaders``: it appends headers to a response whose headers are immutable;
Portkey-AI/gateway issue 1389). With 1.14.2 (the issue's last good release) it still fails
here on Node 20; with 1.13.8 it streams."""
MODEL = "m"
"""The model name the client sends; LiteLLM maps it to ``openai/m`` on the upstream."""

# Node's http server listens on every interface unless told a host; the Portkey gateway's
# CLI takes only a port, so this preload pins every listen without a host to loopback.
NODE_LOOPBACK_PRELOAD = """\
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" && typeof args[1] !== "string") {
    const cb = args.find((a) => typeof a === "function");
    const host = "127.0.0.1";
    return cb ? listen.call(this, args[0], host, cb) : listen.call(this, args[0], host);
  }
  if (args[0] && typeof args[0] === "object" && !args[0].host && !args[0].path) {
    args[0] = { ...args[0], host: "127.0.0.1" };
  }
  return listen.apply(this, args);
};
"""


@dataclass
class Started:
    """A started path: its process, the headers every request to it carries, and the GET path
    that answers once it is up."""

    proc: Proc
    headers: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/health"
    stderr_log: Path | None = None


Launcher = Callable[[str, Path], Started]
"""(upstream base URL, the run's temp dir) -> the started path."""


def _spawn(
    name: str, cmd: list[str], port: int, tmp: Path, env: dict[str, str] | None = None
) -> tuple[Proc, Path]:
    """Start ``cmd`` (stdout to /dev/null, stderr to ``tmp/<name>.stderr``) as the path
    ``name`` served on ``port``."""
    log = tmp / f"{name}.stderr"
    try:
        with log.open("wb") as err:
            popen = subprocess.Popen(
                cmd,
                cwd=tmp,
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
    except OSError as exc:
        raise PeerUnavailable(f"cannot run {cmd[0]}: {exc}") from exc
    return Proc(name, popen, f"http://{HOST}:{port}"), log


def start_timing_proxy(upstream: str, tmp: Path) -> Started:
    """``python -m proxy serve`` as ``bench/overhead`` starts it (JSON log line to /dev/null)."""
    config = tmp / "timing-proxy.toml"
    config.write_text("[upstream]\nmax_connections = 64\n")
    return Started(start_proxy("timing-proxy", upstream, config, None, False))


def start_bare_relay(upstream: str, tmp: Path) -> Started:
    """The reference: the proxy's relay loop in aiohttp with nothing else."""
    return Started(start_reference(BARE, upstream))


def _install_litellm() -> Path:
    return ensure_venv("litellm", LITELLM_REQUIREMENT, "litellm")


def _install_portkey() -> Path:
    entry = "build/start-server.js"
    return ensure_npm("portkey", PORTKEY_PACKAGE, PORTKEY_VERSION, entry, PORTKEY_OVERRIDES)


def _install_kvprof() -> Path:
    return ensure_venv("kvprof", KVPROF_REQUIREMENT, "kvprof")


def _install_mitmproxy() -> Path:
    return ensure_venv("mitmproxy", MITMPROXY_REQUIREMENT, "mitmdump")


INSTALLERS: dict[str, Callable[[], Path]] = {
    "litellm": _install_litellm,
    "portkey": _install_portkey,
    "kvprof": _install_kvprof,
    "mitmproxy": _install_mitmproxy,
}


def install(name: str) -> None:
    """Install the peer ``name`` if it needs an install of its own (PeerUnavailable if it
    cannot be installed)."""
    if name in INSTALLERS:
        INSTALLERS[name]()


def start_litellm(upstream: str, tmp: Path) -> Started:
    """LiteLLM's proxy (uvicorn, one worker) with one ``openai/m`` model on the upstream; no
    callbacks, no database, no spend logs, a master key (it refuses to start without one),
    the bundled cost map (nothing fetched)."""
    exe = _install_litellm()
    config = tmp / "litellm.yaml"
    key = "sk-bench-" + secrets.token_hex(16)
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  callbacks: []\n"
        "  success_callback: []\n"
        "  failure_callback: []\n"
        "  set_verbose: false\n"
        "  turn_off_message_logging: true\n"
        "general_settings:\n"
        f"  master_key: {key}\n"
        "  disable_spend_logs: true\n"
    )
    port = free_port(HOST)
    cmd = [str(exe), "--config", str(config), "--host", HOST, "--port", str(port)]
    cmd += ["--num_workers", "1"]
    env = {
        "LITELLM_MODE": "PRODUCTION",  # no .env loading
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map
        "LITELLM_LOG": "ERROR",
        "DISABLE_ADMIN_UI": "True",
        "NO_DOCS": "True",
    }
    proc, log = _spawn("litellm", cmd, port, tmp, env)
    headers = {"Authorization": f"Bearer {key}"}  # it refuses to start without a master key
    return Started(proc, headers, ready_path="/health/liveliness", stderr_log=log)


def start_portkey(upstream: str, tmp: Path) -> Started:
    """The Portkey gateway (``build/start-server.js --headless``) on Node; every request says
    ``x-portkey-provider: openai`` and ``x-portkey-custom-host: <upstream>/v1``."""
    entry = _install_portkey()
    preload = tmp / "loopback.cjs"
    preload.write_text(NODE_LOOPBACK_PRELOAD)
    port = free_port(HOST)
    cmd = ["node", "--require", str(preload), str(entry), f"--port={port}", "--headless"]
    proc, log = _spawn("portkey", cmd, port, tmp, {"NODE_ENV": "production"})
    headers = {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": f"{upstream}/v1",
        "Authorization": "Bearer none",
    }
    return Started(proc, headers, ready_path="/", stderr_log=log)


def start_kvprof(upstream: str, tmp: Path) -> Started:
    """``kvprof tap``: a threaded byte relay that records every chat request as a JSON trace
    (in the run's temp dir)."""
    exe = _install_kvprof()
    port = free_port(HOST)
    traces = tmp / "kvprof-traces"
    traces.mkdir()
    cmd = [str(exe), "tap", "--upstream", upstream, "--listen", f"{HOST}:{port}"]
    cmd += ["--trace-dir", str(traces)]
    proc, log = _spawn("kvprof", cmd, port, tmp)
    return Started(proc, stderr_log=log)


def start_mitmproxy(upstream: str, tmp: Path) -> Started:
    """``mitmdump --mode reverse:<upstream>`` with its defaults (one line per flow, to
    /dev/null); its CA and state in the run's temp dir."""
    exe = _install_mitmproxy()
    port = free_port(HOST)
    cmd = [str(exe), "--mode", f"reverse:{upstream}", "--listen-host", HOST]
    cmd += ["--listen-port", str(port), "--set", f"confdir={tmp / 'mitmproxy'}"]
    proc, log = _spawn("mitmproxy", cmd, port, tmp)
    return Started(proc, stderr_log=log)


@dataclass(frozen=True)
class PathSpec:
    """One path of the run: how to start it and what it does beyond forwarding bytes."""

    launch: Launcher
    does: str
    analyses: bool
    """Does more than forward (parses, records, translates): the set timing-proxy is judged in."""


PATHS: dict[str, PathSpec] = {
    "bare-relay": PathSpec(
        start_bare_relay, "reference: aiohttp relay loop, nothing else", analyses=False
    ),
    "timing-proxy": PathSpec(
        start_timing_proxy,
        "parses every event: timing record per request, /stats, metrics, log line",
        analyses=True,
    ),
    "litellm": PathSpec(
        start_litellm,
        "gateway: parses the request, re-encodes every chunk through its OpenAI client",
        analyses=True,
    ),
    "portkey": PathSpec(
        start_portkey,
        "gateway: provider routing, re-frames the stream through its OpenAI handler",
        analyses=True,
    ),
    "kvprof": PathSpec(
        start_kvprof,
        "threaded byte tap: parses HTTP + SSE, writes one JSON trace per request",
        analyses=True,
    ),
    "mitmproxy": PathSpec(
        start_mitmproxy,
        "reverse proxy: parses HTTP into flow objects (addons), no LLM analysis",
        analyses=True,
    ),
}
"""Every path but ``direct``, in the order the table shows them."""
