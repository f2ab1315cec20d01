"""Command line: ``timing-proxy serve|report|bench|demo``. Parsing only; no business logic."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from proxy import __version__
from proxy.config import ConfigError, load_config, parse_listen

__all__ = ["main"]


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
    serve.add_argument("--upstream", help="llama-server base URL (default http://127.0.0.1:8080)")
    serve.add_argument("--log-file", help="also append the JSON log lines to this file")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from proxy.app import run
    from proxy.logs import configure_logging

    overrides: dict[str, dict[str, object]] = {"server": {}, "upstream": {}, "log": {}}
    if args.listen:
        host, port = parse_listen(args.listen)
        overrides["server"].update(host=host, port=port)
    overrides["upstream"]["url"] = args.upstream
    overrides["log"]["file"] = args.log_file
    config = load_config(args.config, overrides)
    sinks = configure_logging(config.log.level, config.log.file)
    try:
        run(config)
    finally:
        for sink in sinks[1:]:
            sink.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``timing-proxy`` script and ``python -m proxy``."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
    except ConfigError as exc:
        print(f"timing-proxy: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
