"""Configuration: a frozen dataclass tree loaded from TOML.

Precedence: overrides (command-line flags) > the TOML file > built-in defaults.
Every value is checked against its field's declared type (bool must be a real bool, int must
not be a bool, float also accepts int, ``str | None`` maps "" to None) and against the rules
in the field's metadata (``ge``/``gt``/``le`` bounds, ``choices``, a ``check`` callable).
Unknown sections, unknown keys and bad values raise ConfigError naming the full key.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from proxy.core.boards import BOARD_PRESETS

__all__ = [
    "BOARD_PRESETS",
    "AccountingConfig",
    "AdminConfig",
    "AnnotateConfig",
    "BoardConfig",
    "ClientConfig",
    "Config",
    "ConfigError",
    "FleetConfig",
    "LogConfig",
    "OtelConfig",
    "ServerConfig",
    "StatsConfig",
    "UpstreamConfig",
    "load_config",
    "parse_labels",
    "parse_listen",
]


_LOG_LEVELS = ("debug", "info", "warning", "error")
_TELEMETRY_MODES = ("off", "auto", "tegrastats", "proc")
_ANNOTATE_MODES = ("off", "sse-comment")


def _check_listen(value: str) -> str:
    parse_listen(value)  # raises ConfigError, which names the value
    return value


def _check_optional_url(value: str) -> str:
    return _check_url(value) if value else value


def _check_labels(value: str) -> str:
    parse_labels(value)
    return value


class ConfigError(ValueError):
    """A config file, value or override is invalid; the message names the full key."""


def _nonempty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


_USERINFO = re.compile(r"(?<=//)[^/?#]*@")


def _shown(url: str) -> str:
    """``url`` as an error may quote it: any ``user:password@`` replaced by ``***@``."""
    return repr(_USERINFO.sub("***@", url, count=1))


def _check_url(value: str) -> str:
    if any(c.isspace() for c in value):
        raise ValueError(f"must not contain whitespace, got {_shown(value)}")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc}), got {_shown(value)}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"must be an http:// or https:// URL, got {_shown(value)}")
    if not parts.hostname:
        raise ValueError(f"must name a host, got {_shown(value)}")
    if "?" in value or "#" in value:
        raise ValueError(f"must not have a query or fragment, got {_shown(value)}")
    return value.rstrip("/")


def _check_upstream_url(value: str) -> str:
    """An upstream URL without credentials: aiohttp turns a ``user:password@`` into a Basic
    ``Authorization`` of every request and refuses one that has its own (the OpenAI SDK always
    sends one), and llama-server takes its key as a bearer token: ``[upstream] api_key``."""
    url = _check_url(value)
    if "@" in urlsplit(url).netloc:
        raise ValueError(
            f"must not carry credentials (user:password@), got {_shown(url)}: "
            "put llama-server's --api-key in [upstream] api_key instead"
        )
    return url


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = field(default="127.0.0.1", metadata={"check": _nonempty})
    port: int = field(default=8081, metadata={"ge": 0, "le": 65535})
    max_body_bytes: int = field(default=32 * 1024 * 1024, metadata={"ge": 1})
    shutdown_drain_s: float = field(default=30.0, metadata={"ge": 0})


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    url: str = field(default="http://127.0.0.1:8080", metadata={"check": _check_upstream_url})
    connect_timeout_s: float = field(default=5.0, metadata={"gt": 0})
    header_timeout_s: float = field(default=0.0, metadata={"ge": 0})  # 0 = off
    idle_timeout_s: float = field(default=300.0, metadata={"ge": 0})  # 0 = off
    keepalive_timeout_s: float = field(default=4.0, metadata={"gt": 0})
    max_connections: int = field(default=16, metadata={"ge": 1})
    max_event_bytes: int = field(default=8 * 1024 * 1024, metadata={"ge": 1})
    api_key: str | None = None  # None ("" in TOML) = the proxy's own requests send no key


@dataclass(frozen=True, slots=True)
class ClientConfig:
    write_timeout_s: float = field(default=60.0, metadata={"ge": 0})  # 0 = off
    read_timeout_s: float = field(default=30.0, metadata={"ge": 0})  # 0 = off
    max_header_bytes: int = field(default=64 * 1024, metadata={"ge": 1024})


@dataclass(frozen=True, slots=True)
class LogConfig:
    file: str | None = None  # None ("" in TOML) = stdout only
    level: str = field(default="info", metadata={"choices": _LOG_LEVELS})


@dataclass(frozen=True, slots=True)
class StatsConfig:
    recent: int = field(default=100, metadata={"ge": 0})
    window: int = field(default=10000, metadata={"ge": 1})


@dataclass(frozen=True, slots=True)
class AccountingConfig:
    enabled: bool = True
    lookup_timeout_s: float = field(default=10.0, metadata={"gt": 0})
    cache_entries: int = field(default=1024, metadata={"ge": 1})
    attribution: bool = True
    attribution_history: int = field(default=64, metadata={"ge": 1})
    attribution_cache_mb: float = field(default=64.0, metadata={"gt": 0})
    schema_entries: int = field(default=256, metadata={"ge": 1})
    conversation_header: str = "X-Conversation-Id"


@dataclass(frozen=True, slots=True)
class PrivacyConfig:
    show_diff_text: bool = False
    raw_conversation_ids: bool = False  # False: the body's user ids are logged as u:<hash>


@dataclass(frozen=True, slots=True)
class BoardConfig:
    preset: str | None = field(default=None, metadata={"choices": tuple(BOARD_PRESETS)})
    memory_bandwidth_gbs: float = field(default=0.0, metadata={"ge": 0})  # 0 = unknown
    peak_tflops: float = field(default=0.0, metadata={"ge": 0})  # 0 = unknown
    telemetry: str = field(default="off", metadata={"choices": _TELEMETRY_MODES})
    telemetry_interval_ms: int = field(default=100, metadata={"ge": 10, "le": 60000})
    tegrastats_path: str = field(default="tegrastats", metadata={"check": _nonempty})
    upstream_pid: int = field(default=0, metadata={"ge": 0})  # 0 = find it by the port
    telemetry_ring: int = field(default=3000, metadata={"ge": 2})


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The listener of the proxy's own pages (``/stats``, ``/metrics``, ``/dashboard``)."""

    listen: str = field(default="127.0.0.1:8082", metadata={"check": _check_listen})
    auth_token: str | None = None  # None ("" in TOML) = no auth


@dataclass(frozen=True, slots=True)
class AnnotateConfig:
    """In-band timing for the agent: off by default (the stream stays byte-identical)."""

    mode: str = field(default="off", metadata={"choices": _ANNOTATE_MODES})
    header: str = field(default="X-Timing-Proxy-Annotate", metadata={"check": _nonempty})
    server_timing_max_bytes: int = field(default=1024 * 1024, metadata={"ge": 0})


@dataclass(frozen=True, slots=True)
class OtelConfig:
    """OpenTelemetry traces (OTLP/HTTP); "" = off unless OTEL_EXPORTER_OTLP_* is set."""

    endpoint: str = field(default="", metadata={"check": _check_optional_url})
    service_name: str = field(default="timing-proxy", metadata={"check": _nonempty})
    max_queue_size: int = field(default=2048, metadata={"ge": 1})
    export_timeout_s: float = field(default=5.0, metadata={"gt": 0})
    server_spans: bool = False
    """Also llama-server's side: a SERVER span with queue, prefill and decode children."""


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """Constant labels naming this proxy among many (``robot=arm-3,site=lab``): on every
    metric and as resource attributes of the spans."""

    labels: str = field(default="", metadata={"check": _check_labels})


@dataclass(frozen=True, slots=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    log: LogConfig = field(default_factory=LogConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    accounting: AccountingConfig = field(default_factory=AccountingConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    board: BoardConfig = field(default_factory=BoardConfig)
    admin: AdminConfig = field(default_factory=AdminConfig)
    annotate: AnnotateConfig = field(default_factory=AnnotateConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)


_KINDS: dict[object, str] = {bool: "true or false", int: "an integer", float: "a number"}


def _fields(cls: type) -> dict[str, tuple[object, Mapping[str, Any]]]:
    """Field name -> (resolved type, metadata) of a section dataclass."""
    hints = get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in dataclasses.fields(cls)}


def _number(value: object, hint: object, rules: Mapping[str, Any]) -> int | float | None:
    """``value`` as the int/float field ``hint`` wants it, or None if wrong type or out of range."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and hint is int:
        return None
    ok = (
        math.isfinite(value)
        and value >= rules.get("ge", -math.inf)
        and value > rules.get("gt", -math.inf)
        and value <= rules.get("le", math.inf)
    )
    return (float(value) if hint is float else value) if ok else None


def _coerce(value: object, hint: object, rules: Mapping[str, Any], where: str) -> object:
    """Check ``value`` against the field's type and rules; return the normalised value."""
    optional = hint == (str | None)
    if "choices" in rules:
        expect = ('"" or ' if optional else "") + "one of " + ", ".join(rules["choices"])
    else:
        ops = (("ge", ">="), ("gt", ">"), ("le", "<="))
        bounds = [f"{op} {rules[key]}" for key, op in ops if key in rules]
        expect = " ".join([_KINDS.get(hint, "a string"), " and ".join(bounds)]).strip()
    result: object = None
    if hint is bool:
        result = value if isinstance(value, bool) else None
    elif hint is int or hint is float:
        result = _number(value, hint, rules)
    elif isinstance(value, str):
        if optional and value == "":
            return None
        if "choices" not in rules or value in rules["choices"]:
            result = value
    if result is None:
        raise ConfigError(f"{where}: must be {expect}, got {value!r}")
    check: Callable[[Any], object] | None = rules.get("check")
    if check is not None:
        try:
            result = check(result)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return result


def _apply(config: Config, data: Mapping[str, object], source: str, *, skip_none: bool) -> Config:
    """Return ``config`` with the sections/keys of ``data`` validated and applied."""
    sections: dict[str, Any] = {}
    for name, table in data.items():
        if name not in _fields(Config):
            raise ConfigError(f"{source}: unknown section [{name}]")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [{name}] must be a table, got {table!r}")
        current: Any = getattr(config, name)
        spec = _fields(type(current))
        changes: dict[str, object] = {}
        for key, value in table.items():
            if key not in spec:
                raise ConfigError(f"{source}: unknown key [{name}] {key}")
            if value is None and skip_none:
                continue
            changes[key] = _coerce(value, *spec[key], f"{source}: [{name}] {key}")
        sections[name] = dataclasses.replace(current, **changes)
    return dataclasses.replace(config, **sections)


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
) -> Config:
    """Load ``path`` (None = built-in defaults) and apply ``overrides`` on top.

    ``overrides`` maps section -> key -> value (e.g. from command-line flags) and is validated
    like the file; a None value means "not given" and is skipped. A board preset fills
    ``memory_bandwidth_gbs``/``peak_tflops`` that are still 0; explicit values win.
    """
    config = Config()
    if path is not None:
        name = os.fspath(path)
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{name}: config file not found") from None
        except OSError as exc:
            raise ConfigError(f"{name}: cannot read config file: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{name}: invalid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{name}: not valid UTF-8: {exc}") from None
        config = _apply(config, data, name, skip_none=False)
    if overrides:
        config = _apply(config, overrides, "overrides", skip_none=True)
    board = config.board
    if board.preset is not None:
        bandwidth, tflops = BOARD_PRESETS[board.preset]
        board = dataclasses.replace(
            board,
            memory_bandwidth_gbs=board.memory_bandwidth_gbs or bandwidth,
            peak_tflops=board.peak_tflops or tflops,
        )
    return dataclasses.replace(config, board=board)


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED_LABELS = frozenset(
    {
        "model",
        "kind",
        "api",
        "outcome",
        "status",
        "cached",
        "state",
        "cause",
        "le",
        "quantile",
        "job",
        "instance",
    }
)


def parse_labels(value: str) -> dict[str, str]:
    """``name=value,name=value`` as a dict; raise ConfigError for a name Prometheus does not
    take, one the proxy's metrics already use, a repeated name or an empty value."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, label = (x.strip() for x in item.partition("="))
        if not sep or not label:
            raise ConfigError(f"label {item!r}: expected name=value")
        if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ConfigError(f"label {name!r}: not a Prometheus label name")
        if name in _RESERVED_LABELS:
            raise ConfigError(f"label {name!r}: the proxy's metrics use that name already")
        if name in out:
            raise ConfigError(f"label {name!r}: given twice")
        out[name] = label
    return out


def parse_listen(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``[IPV6]:PORT`` into (host, port); raise ConfigError if bad."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ConfigError(f"invalid listen address {value!r}: put an IPv6 host in [brackets]")
    if not sep or not host or any(c.isspace() or c in "[]" for c in host):
        raise ConfigError(f"invalid listen address {value!r}: expected HOST:PORT")
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ConfigError(f"invalid listen address {value!r}: port must be 0-65535")
    return host, int(port)
