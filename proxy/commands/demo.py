"""``timing-proxy demo``: the whole product on a fresh machine, with no board or model of
one's own. Provisions a real llama-server and Gemma 3 270M (cached after the first time),
starts both servers, runs a short bench through the proxy, prints the report and leaves
everything running with the URLs printed until Ctrl-C.

llama-server gets the user's extra arguments (``--llama-arg``) and names the model by its
file's stem (``--alias``). The provisioned model gets the provisioned Qwen3 template (Gemma 3's
own ignores tools); a model of the user's own (``--model``) keeps its own template unless
``--chat-template-file`` gives one. Either way the served template's tool support is read from
``/props`` at start, and a template without it is said in one line with the fix. A failure
the user can act on is a ``DemoError``, ``LlamaServerError`` or ``ProvisionError`` whose
first line says what to do.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.commands.errors import DemoError
from proxy.commands.ports import port_or_free

__all__ = ["DemoError", "DemoOptions", "read_props", "run_demo", "tool_support_line"]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``timing-proxy demo`` was asked to do."""

    llama_server: str | None = None
    model: str | None = None
    runs: int = 1
    listen_port: int = 8081
    admin_port: int = 8082
    llama_port: int = 8080
    out_dir: str = "demo-logs"
    wait: bool = True
    llama_args: tuple[str, ...] = ()
    """Extra llama-server arguments, appended to the demo's own (``--no-repack``, ...)."""
    chat_template_file: str | None = None
    """A Jinja chat template for llama-server (``--chat-template-file``)."""


def tool_support_line(props: dict[str, Any]) -> str | None:
    """The one line for a served template without tool support (``/props``
    ``chat_template_caps``), with the fix; ``None`` when it supports tools and tool calls."""
    caps = props.get("chat_template_caps") or {}
    tools, calls = caps.get("supports_tools"), caps.get("supports_tool_calls")
    if tools and calls:
        return None
    what = (
        "drops the tools: they never reach the model"
        if not tools
        else "renders the tools but has no tool-call format: calls come back as text"
    )
    return (
        f"warning: llama-server's chat template {what} (/props chat_template_caps."
        f"supports_tools {str(bool(tools)).lower()}, supports_tool_calls "
        f"{str(bool(calls)).lower()}); fix: --chat-template-file PATH with a tool-capable "
        "template (the model's own tool-use template, or a Qwen3 / Hermes one)"
    )


def read_props(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """llama-server's ``GET /props``."""
    with urllib.request.urlopen(url.rstrip("/") + "/props", timeout=timeout) as resp:
        props: dict[str, Any] = json.loads(resp.read())
        return props


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if proc.poll() is not None:
                raise DemoError(
                    f"timing-proxy serve exited with code {proc.returncode} before answering "
                    f"{url} (its error is printed above)"
                ) from None
            if time.monotonic() > deadline:
                raise DemoError(
                    f"timing-proxy serve did not answer {url} within {timeout:g} s"
                ) from None
            time.sleep(0.1)


def _template(opts: DemoOptions, provisioned: Callable[[], Path]) -> Path | None:
    """The chat template llama-server gets: the user's file, else for the provisioned model
    the provisioned Qwen3 one (Gemma 3's own ignores tools), else the model's own (None)."""
    if opts.chat_template_file:
        template = Path(opts.chat_template_file)
        if not template.is_file():
            raise DemoError(f"--chat-template-file {template}: no such file")
        return template
    return None if opts.model else provisioned()


def _say_tool_support(url: str, say: Callable[[str], None]) -> None:
    """Say in one line when the served template has no tool support."""
    try:
        warning = tool_support_line(read_props(url))
    except (OSError, ValueError):
        return  # a server without /props: nothing to say about its template
    if warning:
        say(warning)


def run_demo(opts: DemoOptions, *, say: Callable[[str], None] = print) -> int:
    """Run the demo; returns the exit code."""
    from proxy.commands.bench import run_bench
    from proxy.commands.provision import (
        LlamaServer,
        chat_template_path,
        ensure_llama_server,
        ensure_model,
    )
    from proxy.commands.report import run_report
    from proxy.serve.model_info import ModelInfo, ModelInfoError

    def log(msg: str) -> None:
        say(f"[provision] {msg}")

    binary = Path(opts.llama_server) if opts.llama_server else ensure_llama_server(log=log)
    model = Path(opts.model) if opts.model else ensure_model(log=log)
    template = _template(opts, lambda: chat_template_path(log=log))
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    llama = LlamaServer(
        binary,
        model,
        template,
        port=port_or_free(opts.llama_port),
        extra_args=opts.llama_args,
        log_dir=out,
        log=lambda msg: say(f"[llama-server] {msg}"),
    )
    say(f"starting llama-server on {llama.url} ...")
    llama.start(timeout=180)
    _say_tool_support(llama.url, say)
    port = port_or_free(opts.listen_port)
    admin_port = port_or_free(opts.admin_port)
    proxy_url = f"http://127.0.0.1:{port}"
    admin_url = f"http://127.0.0.1:{admin_port}"
    log_file = out / "requests.jsonl"
    proxy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--admin-listen",
            f"127.0.0.1:{admin_port}",
            "--upstream",
            llama.url,
            "--log-file",
            str(log_file),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_http(admin_url + "/stats", proxy)
        say(f"timing-proxy on {proxy_url} -> {llama.url}; bench: {opts.runs} run(s)")
        files = run_bench(proxy_url, admin=admin_url, runs=opts.runs, out_dir=str(out))
        try:
            meta = ModelInfo.fetch_blocking(llama.url)
        except ModelInfoError:
            meta = None
        say(
            run_report(
                [str(f) for f in files], json_out=False, kind=None, plot=None, board=None, meta=meta
            )
        )
        say(
            "\n".join(
                [
                    "",
                    f"  agent base_url   {proxy_url}/v1",
                    f"  dashboard        {admin_url}/dashboard",
                    f"  stats            {admin_url}/stats",
                    f"  metrics          {admin_url}/metrics",
                    f"  llama-server     {llama.url}",
                    f"  request log      {log_file}   (tail -f {log_file} | jq)",
                    f"  bench logs       {', '.join(str(f) for f in files)}",
                ]
            )
        )
        if opts.wait:
            say("\nboth servers keep running: press Ctrl-C to stop them.")
            signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
            try:
                while proxy.poll() is None and llama.running:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                say("stopping ...")
        return 0
    finally:
        proxy.terminate()
        try:
            proxy.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proxy.kill()
        llama.stop()
