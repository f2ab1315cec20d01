"""Command line: ``timing-proxy serve|report|bench|demo|explain``, each command's arguments
handed to the code that runs it (the parser is :mod:`proxy.commands.arguments`).

A failure the user can cause (bad config, unreadable log, a port in use, a llama-server that
will not start, a failed provisioning step) ends as one line, ``timing-proxy: error: ...``
on stderr, and exit code 2; never a traceback.

A command's modules are imported when it runs, not before: ``serve`` starts without loading
``report``, ``bench``, ``demo``, ``explain`` or the provisioning (their errors, which the
line above needs, are in :mod:`proxy.commands.errors`).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from proxy.commands.arguments import build_parser
from proxy.commands.errors import (
    DemoError,
    ExplainError,
    LlamaServerError,
    ProvisionError,
    ReportError,
)
from proxy.config import Config, ConfigError, load_config, parse_listen

if TYPE_CHECKING:
    from proxy.core.roofline import ModelMeta

__all__ = ["error_line", "main", "serve_config"]

USER_ERRORS = (
    ConfigError,
    ReportError,
    ProvisionError,
    LlamaServerError,
    DemoError,
    ExplainError,
    OSError,
)
"""Failures the user can cause and fix: reported in one line, without a traceback."""


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
    from proxy.serve.logs import configure_logging

    config = serve_config(args)
    outputs = configure_logging(config.log.level, config.log.file)
    try:
        from proxy.serve.app import run  # after the config and the log, whose errors need none

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
        meta = _fetched_meta(args.upstream)
    return board, meta


def _fetched_meta(upstream: str) -> ModelMeta | None:
    """The served model's metadata from ``upstream``'s ``/v1/models``; a server that cannot
    be read is the user's to fix, said in one line."""
    from proxy.serve.model_info import ModelInfo, ModelInfoError

    try:
        return ModelInfo.fetch_blocking(upstream)
    except ModelInfoError as exc:
        raise ReportError(str(exc)) from None


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
    args = build_parser().parse_args(argv)
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
