"""The ``timing-proxy`` argument parser: each command's flags, their help and defaults."""

from __future__ import annotations

import argparse
import math
from typing import Any

from proxy import __version__

__all__ = ["build_parser"]

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


def build_parser() -> argparse.ArgumentParser:
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
