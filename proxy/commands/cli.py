"""Command line: ``timing-proxy serve|report|bench|demo|explain``. Parsing only; no business logic.

A failure the user can cause (bad config, unreadable log, a port in use, a llama-server that
will not start, a failed provisioning step) ends as one line, ``timing-proxy: error: ...``
on stderr, and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from proxy import __version__
from proxy.commands.demo import DemoError
from proxy.commands.explain import ExplainError
from proxy.commands.provision import LlamaServerError, ProvisionError
from proxy.commands.report import ReportError
from proxy.config import Config, ConfigError, load_config, parse_listen
from proxy.serve.model_info import ModelInfoError

__all__ = ["error_line", "main", "serve_config"]

USER_ERRORS = (
    ConfigError,
    ReportError,
    ModelInfoError,
    ProvisionError,
    LlamaServerError,
    DemoError,
    ExplainError,
    OSError,
)
"""Failures the user can cause and fix: reported in one line, without a traceback."""

EXPLAIN_EPILOG = """\
example, against a llama-server already running on port 8080:
  timing-proxy explain --upstream http://127.0.0.1:8080 --runs 3 --json explain.json

Each term is two variants of the same request sent back to back, repeated --runs times:
  schema prefill    with the tools vs without, cache cold (beside the record's estimate)
  free fix          with the tools, cache warm (same prefix sent just before) vs cold
  tool-path decode  the call through Chat Completions vs the same prompt rendered by the
                    served template and completed raw on /completion (same call required)
  thinking          enable_thinking true vs false, where the template has the switch
  image             with vs without the image, cache cold (server with a projector)
A difference within its spread (the IQR of the paired differences) is printed as
"not measurable here". No setting of the server is changed.
"""

LLAMA_ARG_HELP = (
    "extra llama-server argument, repeatable; write it with '=' so a leading dash is kept: "
    "--llama-arg=--no-repack --llama-arg=-t --llama-arg=1"
)


def _count(text: str) -> int:
    """A positive count as ``--model-size``/``--params`` take it: ``2450000000`` or
    ``2.45e9`` (rounded to a whole number)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (write e.g. 2.45e9)") from None
    if not math.isfinite(value) or value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return round(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timing-proxy",
        description="OpenAI-compatible timing proxy for llama-server: where every call's "
        "time goes, without touching a byte.",
    )
    parser.add_argument("--version", action="version", version=f"timing-proxy {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="config.toml to load (default: built-in defaults)")
    serve.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:8081)")
    serve.add_argument(
        "--admin-listen",
        help="HOST:PORT of /stats, /metrics and /dashboard (default 127.0.0.1:8082)",
    )
    serve.add_argument("--upstream", help="llama-server base URL (default http://127.0.0.1:8080)")
    serve.add_argument("--log-file", help="also append the JSON log lines to this file")
    serve.add_argument(
        "--admin-token-env",
        metavar="NAME",
        help="take [admin] auth_token from the environment variable NAME (an error when it is"
        " unset or empty)",
    )

    report = sub.add_parser("report", help="summarise request logs (several files = runs)")
    report.add_argument(
        "logs",
        nargs="+",
        help="the proxy's or bench's JSON-lines logs, or another harness's calls: JSON lines,"
        ' a JSON list, or {"chat": [...], "tool": [...]}',
    )
    report.add_argument("--json", action="store_true", help="print JSON (the /stats shape)")
    report.add_argument("--kind", choices=("chat", "tool"), help="only this kind")
    report.add_argument("--plot", metavar="FILE.png", help="draw the median calls' clocks")
    report.add_argument("--config", help="config.toml whose [board] section to use")
    report.add_argument("--board", help="board preset, e.g. jetson-orin-nano-8gb")
    report.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth, GB/s")
    report.add_argument(
        "--peak-tflops", type=float, help="peak compute, TFLOP/s (replaces the preset's peaks)"
    )
    report.add_argument("--upstream", help="llama-server URL to read the model's size from")
    report.add_argument(
        "--model-size", type=_count, metavar="BYTES", help="model weights in bytes, e.g. 2.45e9"
    )
    report.add_argument(
        "--params", type=_count, metavar="N", help="model parameters, e.g. 4e9 (with --model-size)"
    )

    bench = sub.add_parser("bench", help="send a prompt set N times, one log per run")
    bench.add_argument(
        "--proxy",
        default="http://127.0.0.1:8081",
        help="the proxy to send through (default http://127.0.0.1:8081)",
    )
    bench.add_argument(
        "--admin",
        default="http://127.0.0.1:8082",
        help="the proxy's admin listener, where records are read (default http://127.0.0.1:8082)",
    )
    bench.add_argument(
        "--direct",
        metavar="UPSTREAM",
        help="send straight to this llama-server instead, for comparison",
    )
    bench.add_argument("--prompts", help="prompt set, TOML or JSON (default: the robot set)")
    bench.add_argument("--runs", type=int, default=3, help="how many runs (default 3)")
    bench.add_argument("--out", default="bench-logs", help="folder for the run logs")
    bench.add_argument("--model", default="default", help="model name sent in requests")
    bench.add_argument("--token", help="bearer token of the proxy's admin listener")
    bench.add_argument("--report", action="store_true", help="print the report afterwards")

    demo = sub.add_parser("demo", help="provision llama-server + Gemma 3 270M, run everything")
    demo.add_argument("--llama-server", help="your own llama-server binary")
    demo.add_argument("--model", help="your own GGUF model")
    demo.add_argument(
        "--chat-template-file",
        metavar="PATH",
        help="Jinja chat template passed to llama-server (a tool-capable one for your model)",
    )
    demo.add_argument("--runs", type=int, default=1, help="bench runs (default 1)")
    demo.add_argument("--port", type=int, default=8081, help="proxy port (default 8081)")
    demo.add_argument(
        "--admin-port", type=int, default=8082, help="admin listener port (default 8082)"
    )
    demo.add_argument(
        "--llama-port", type=int, default=8080, help="llama-server port (default 8080)"
    )
    demo.add_argument(
        "--out", default="demo-logs", help="folder for logs (default ./demo-logs, where you run it)"
    )
    demo.add_argument("--no-wait", action="store_true", help="stop after the report")
    demo.add_argument(
        "--llama-arg",
        action="append",
        default=[],
        metavar="ARG",
        dest="llama_args",
        help=LLAMA_ARG_HELP,
    )
    _explain_parser(sub)
    return parser


def _explain_parser(sub: Any) -> None:
    explain = sub.add_parser(
        "explain",
        help="measure what each cause costs on this board: schema, cache, tool path, thinking",
        description="An experiment against a running llama-server (direct, or through the\n"
        "proxy): controlled variants of the prompt set's tool requests, interleaved, and\n"
        "for each term the measured difference with its spread.",
        epilog=EXPLAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument(
        "--upstream",
        default="http://127.0.0.1:8080",
        help="llama-server base URL (default http://127.0.0.1:8080)",
    )
    explain.add_argument("--prompts", help="prompt set, TOML or JSON (default: the robot set)")
    explain.add_argument("--runs", type=int, default=3, help="how many runs (default 3)")
    explain.add_argument("--json", metavar="PATH", help="write every measurement to this file")
    explain.add_argument("--model", default="default", help="model name sent in requests")


def _token_from(name: str, environ: Mapping[str, str]) -> str:
    """The admin token held by the environment variable ``name``; ConfigError when it holds
    none (the listener would otherwise start open, the opposite of what was asked)."""
    token = environ.get(name, "")
    if not token.strip():
        raise ConfigError(
            f"--admin-token-env {name}: the variable is unset or empty; set it to the bearer"
            f" token the admin pages must require (e.g. {name}=$(openssl rand -hex 16))"
        )
    return token


def serve_config(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> Config:
    """The config ``serve`` runs with: the file, then the flags (and the admin token from the
    environment variable ``--admin-token-env`` names)."""
    overrides: dict[str, dict[str, object]] = {
        "server": {},
        "upstream": {},
        "log": {},
        "admin": {"listen": args.admin_listen},
    }
    if args.listen:
        host, port = parse_listen(args.listen)
        overrides["server"].update(host=host, port=port)
    overrides["upstream"]["url"] = args.upstream
    overrides["log"]["file"] = args.log_file
    if args.admin_token_env:
        overrides["admin"]["auth_token"] = _token_from(args.admin_token_env, environ)
    return load_config(args.config, overrides)


def _serve(args: argparse.Namespace) -> int:
    from proxy.serve.app import run
    from proxy.serve.logs import configure_logging

    config = serve_config(args)
    outputs = configure_logging(config.log.level, config.log.file)
    try:
        run(config)
    finally:
        outputs.close()
    return 0


def _board_and_meta(args: argparse.Namespace) -> tuple[Any, Any]:
    from proxy.config import BoardConfig
    from proxy.core.roofline import Board, ModelMeta

    board_cfg = load_config(args.config).board if args.config else BoardConfig()
    if args.board or args.bandwidth_gbs or args.peak_tflops:
        board_cfg = load_config(
            None,
            {
                "board": {
                    "preset": args.board or board_cfg.preset,
                    "memory_bandwidth_gbs": args.bandwidth_gbs or board_cfg.memory_bandwidth_gbs,
                    "peak_tflops": args.peak_tflops or board_cfg.peak_tflops,
                }
            },
        ).board
    board = Board.from_config(board_cfg)
    meta = None
    if (args.model_size is None) != (args.params is None):
        given, lacking = (
            ("--model-size", "--params N (the parameter count, e.g. 4e9)")
            if args.params is None
            else ("--params", "--model-size BYTES (the weights' size, e.g. 2.45e9)")
        )
        raise ReportError(
            f"{given} needs {lacking} too: the roofline takes both (or --upstream URL to read"
            " them from llama-server)"
        )
    if args.model_size is not None and args.params is not None:
        meta = ModelMeta(args.model_size, args.params, None, "--model-size, --params")
    elif args.upstream:
        from proxy.serve.model_info import ModelInfo

        meta = ModelInfo.fetch_blocking(args.upstream)
    return board, meta


def _report(args: argparse.Namespace) -> int:
    from proxy.commands.report import run_report

    board, meta = _board_and_meta(args)
    print(
        run_report(
            args.logs, json_out=args.json, kind=args.kind, plot=args.plot, board=board, meta=meta
        ),
        end="",
    )
    return 0


def _bench(args: argparse.Namespace) -> int:
    from proxy.commands.bench import load_prompts, run_bench

    files = run_bench(
        args.direct or args.proxy,
        admin=args.admin,
        direct=bool(args.direct),
        prompts=load_prompts(args.prompts),
        runs=args.runs,
        out_dir=args.out,
        model=args.model,
        token=args.token,
    )
    for f in files:
        print(f)
    if args.report:
        from proxy.commands.report import run_report

        print(
            run_report(
                [str(f) for f in files], json_out=False, kind=None, plot=None, board=None, meta=None
            )
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from proxy.commands.demo import DemoOptions, run_demo

    return run_demo(
        DemoOptions(
            llama_server=args.llama_server,
            model=args.model,
            runs=args.runs,
            listen_port=args.port,
            admin_port=args.admin_port,
            llama_port=args.llama_port,
            out_dir=args.out,
            wait=not args.no_wait,
            llama_args=tuple(args.llama_args),
            chat_template_file=args.chat_template_file,
        )
    )


def _explain(args: argparse.Namespace) -> int:
    from proxy.commands.bench import load_prompts
    from proxy.commands.explain import ExplainOptions, run_explain

    try:
        prompts = load_prompts(args.prompts)
    except (ValueError, KeyError, TypeError) as exc:
        raise ExplainError(f"{args.prompts}: not a prompt set ({exc})") from None
    run_explain(
        ExplainOptions(
            upstream=args.upstream,
            prompts=prompts,
            runs=args.runs,
            model=args.model,
            json_path=args.json,
        )
    )
    return 0


_LISTENERS = {
    "server": "--listen HOST:PORT or [server] port",
    "admin": "--admin-listen HOST:PORT or [admin] listen",
}
"""How to choose another address for each listener (by its config section): the flag of
``serve`` and the config key."""


def error_line(exc: BaseException) -> str:
    """The one line a user sees for ``exc``: its message's first line (later lines carry a
    log's tail, whose path the first line names); a port in use says how to pick another
    for the listener that could not bind (the agent's, unless the error names another)."""
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        from proxy.serve.app import PortInUse  # here: the other commands never load the app

        listener = exc.listener if isinstance(exc, PortInUse) else "server"
        choose = _LISTENERS.get(listener, _LISTENERS["server"])
        return (
            f"{exc.strerror or exc} (another process holds that port: choose another with "
            f"{choose} in the config)"
        )
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{where}{exc.strerror}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``timing-proxy`` script and ``python -m proxy``."""
    args = _parser().parse_args(argv)
    try:
        command = {
            "serve": _serve,
            "report": _report,
            "bench": _bench,
            "demo": _demo,
            "explain": _explain,
        }
        return command[args.command](args)
    except USER_ERRORS as exc:
        print(f"timing-proxy: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
