"""``timing-proxy demo``: the whole product on a fresh machine, with no board or model of
one's own. Provisions a real llama-server and Gemma 3 270M (cached after the first time),
starts both servers, runs a short bench through the proxy, prints the report and leaves
everything running with the URLs printed until Ctrl-C.

llama-server gets the user's extra arguments (``--llama-arg``) and names the model by its
file's stem (``--alias``); a failure the user can act on is a ``DemoError``,
``LlamaServerError`` or ``ProvisionError`` whose first line says what to do.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from proxy.commands.ports import port_or_free

__all__ = ["DemoError", "DemoOptions", "run_demo"]


class DemoError(RuntimeError):
    """The demo's proxy did not come up (the message is one line)."""


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
    # Gemma 3's own template ignores tools: the default model gets a tool-capable one.
    template = None if opts.model else chat_template_path(log=log)
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
