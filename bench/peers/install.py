"""The peers: each one's own install and how it starts in front of the fake upstream.

Each peer lives in a virtualenv (PyPI) or a ``node_modules`` (npm) under
``$TIMING_PROXY_CACHE/peers/<name>`` (default ``~/.cache/timing-proxy/peers``), built on first
use and reused while its marker names the same requirement. It listens on 127.0.0.1 only,
its stdout to /dev/null, its stderr in the run's temp dir. A peer that cannot be installed
or started raises :class:`Unavailable` with the reason, and the run skips it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from bench.overhead.procs import HOST, Proc
from bench.overhead.run import PathSpec, Started, Unavailable
from proxy.commands.ports import free_port
from proxy.commands.provision.cache import cache_root, locked, tail

LITELLM = "litellm[proxy]==1.108.7"
KVPROF = "kvprof==0.2.0"
MITMPROXY = "mitmproxy==11.0.2"
PORTKEY = "@portkey-ai/gateway@1.15.2"
PORTKEY_OVERRIDES = {"@hono/node-server": "1.13.8"}
"""With the ``@hono/node-server`` its range resolves to, the gateway answers every streamed
chat request with HTTP 500 (``TypeError: immutable`` in its ``updateHeaders``); with 1.13.8
it streams."""
MARKER = ".timing-proxy-peer"

# Node's http server listens on every interface unless given a host, and the Portkey CLI
# takes only a port: this preload pins every listen without a host to loopback.
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


def _log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def _run_logged(cmd: list[str], log_file: Path, cwd: Path | None = None) -> None:
    """Run an installer with its output in ``log_file``; Unavailable with the log's tail."""
    try:
        with log_file.open("ab") as out:
            done = subprocess.run(
                cmd,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=1200,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
                check=False,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{cmd[0]}: {exc}") from exc
    if done.returncode != 0:
        last = tail(log_file, 3).replace("\n", " / ")
        raise Unavailable(f"`{' '.join(cmd[-3:])}` failed ({log_file}): {last}")


def _ensure(name: str, spec: str, exe: Path, steps: list[list[str]], files: dict[str, str]) -> Path:
    """``exe`` of the peer's install of ``spec`` under ``peers/<name>``: ``files`` written
    there, then the ``steps`` run there; made once, reused while the marker says ``spec``."""
    home = cache_root() / "peers" / name
    with locked(home.parent / "locks" / f"{name}.lock", _log, f"{name} install"):
        marker = home / MARKER
        if marker.is_file() and marker.read_text() == spec and exe.exists():
            return exe
        _log(f"installing {spec} into {home} (once)")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        for file, text in files.items():
            (home / file).write_text(text)
        log_file = home.parent / f"{name}-install.log"
        log_file.write_text("")
        for cmd in steps:
            _run_logged(cmd, log_file, cwd=home)
        if not exe.exists():
            raise Unavailable(f"{spec} installed no {exe.name}")
        marker.write_text(spec)
        return exe


def ensure_venv(name: str, requirement: str, executable: str) -> Path:
    """``bin/<executable>`` of the peer's virtualenv with ``requirement``."""
    home = cache_root() / "peers" / name
    py = str(home / "bin" / "python")
    steps = [[sys.executable, "-m", "venv", str(home)], [py, "-m", "pip", "install", requirement]]
    return _ensure(name, requirement, home / "bin" / executable, steps, {})


def ensure_portkey() -> Path:
    """The gateway's ``build/start-server.js`` in its own ``node_modules``."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise Unavailable("node/npm not on PATH")
    manifest = json.dumps({"private": True, "overrides": PORTKEY_OVERRIDES}, sort_keys=True)
    home = cache_root() / "peers" / "portkey"
    entry = home / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    steps = [[npm, "install", "--no-audit", "--no-fund", PORTKEY]]
    return _ensure("portkey", f"{PORTKEY} {manifest}", entry, steps, {"package.json": manifest})


def _spawn(
    name: str, cmd: list[str], port: int, tmp: Path, env: dict[str, str] | None = None
) -> Started:
    """Start ``cmd``, which serves on ``port``, its stderr to ``tmp/<name>.stderr``."""
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
        raise Unavailable(f"cannot run {cmd[0]}: {exc}") from exc
    return Started(Proc(name, popen, f"http://{HOST}:{port}"), stderr_log=log)


def start_litellm(upstream: str, tmp: Path) -> Started:
    """LiteLLM's proxy (uvicorn, one worker), one model ``m`` -> ``openai/m`` on the
    upstream; no callbacks, no database, no spend logs, the bundled cost map; a master key,
    without which it will not start."""
    exe = ensure_venv("litellm", LITELLM, "litellm")
    key = "sk-bench-" + secrets.token_hex(16)
    config = tmp / "litellm.yaml"
    config.write_text(
        f"model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n"
        f"      api_base: {upstream}/v1\n      api_key: none\n"
        "litellm_settings:\n  callbacks: []\n  success_callback: []\n  failure_callback: []\n"
        "  set_verbose: false\n  turn_off_message_logging: true\n"
        f"general_settings:\n  master_key: {key}\n  disable_spend_logs: true\n"
    )
    port = free_port(HOST)
    cmd = [str(exe), "--config", str(config), "--num_workers", "1", "--host", HOST]
    env = {"LITELLM_MODE": "PRODUCTION", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env |= {"LITELLM_LOG": "ERROR", "DISABLE_ADMIN_UI": "True", "NO_DOCS": "True"}
    started = _spawn("litellm", [*cmd, "--port", str(port)], port, tmp, env)
    started.headers = {"Authorization": f"Bearer {key}"}
    started.ready_url = started.proc.url + "/health/liveliness"
    return started


def start_portkey(upstream: str, tmp: Path) -> Started:
    """The Portkey gateway on Node, headless; each request names the provider and host."""
    entry, port = ensure_portkey(), free_port(HOST)
    preload = tmp / "loopback.cjs"
    preload.write_text(NODE_LOOPBACK_PRELOAD)
    cmd = ["node", "--require", str(preload), str(entry), "--headless", f"--port={port}"]
    started = _spawn("portkey", cmd, port, tmp, {"NODE_ENV": "production"})
    started.headers = {"x-portkey-provider": "openai", "x-portkey-custom-host": f"{upstream}/v1"}
    started.headers["Authorization"] = "Bearer none"
    started.ready_url = started.proc.url + "/"
    return started


def start_kvprof(upstream: str, tmp: Path) -> Started:
    """``kvprof tap``: a thread per connection, every chat request written as a JSON trace."""
    exe, port = ensure_venv("kvprof", KVPROF, "kvprof"), free_port(HOST)
    (tmp / "kvprof-traces").mkdir()
    cmd = [str(exe), "tap", "--upstream", upstream, "--trace-dir", str(tmp / "kvprof-traces")]
    return _spawn("kvprof", [*cmd, "--listen", f"{HOST}:{port}"], port, tmp)


def start_mitmproxy(upstream: str, tmp: Path) -> Started:
    """``mitmdump --mode reverse:<upstream>``, its defaults, its CA in the temp dir."""
    exe, port = ensure_venv("mitmproxy", MITMPROXY, "mitmdump"), free_port(HOST)
    cmd = [str(exe), "--mode", f"reverse:{upstream}", "--set", f"confdir={tmp / 'mitmproxy'}"]
    return _spawn("mitmproxy", [*cmd, "--listen-host", HOST, "--listen-port", str(port)], port, tmp)


PEERS = {
    "litellm": PathSpec(
        start_litellm,
        "gateway: parses the request, re-encodes every chunk through its OpenAI client",
        True,
        LITELLM,
    ),
    "portkey": PathSpec(
        start_portkey,
        "gateway: provider routing, re-frames the stream through its OpenAI handler",
        True,
        f"{PORTKEY} (npm overrides {PORTKEY_OVERRIDES})",
    ),
    "kvprof": PathSpec(
        start_kvprof,
        "threaded byte tap: parses HTTP + SSE, writes one JSON trace per request",
        True,
        KVPROF,
    ),
    "mitmproxy": PathSpec(
        start_mitmproxy,
        "reverse proxy: parses HTTP into flow objects (addons), no LLM analysis",
        True,
        MITMPROXY,
    ),
}
