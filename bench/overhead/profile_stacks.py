"""py-spy's collapsed stacks (``--format raw``) summarised: the share of the busy samples
each component takes, as self time (the first known owner from the leaf up) and inclusive
(every component anywhere in the stack), and the top frames."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Frame = tuple[str, str]  # (function, short file)
Predicate = Callable[[str, str], bool]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

_RECORD_AND_LOG = (
    "proxy/core/assemble.py",
    "proxy/core/record.py",
    "proxy/core/stats.py",
    "proxy/serve/logs.py",
    "proxy/serve/metrics",
    "structlog/",
    "prometheus_client/",
)
_AIOHTTP_READ = (
    "aiohttp/streams.py",
    "aiohttp/client_proto.py",
    "aiohttp/_http_parser",
    "aiohttp/http_parser.py",
)
_AIOHTTP_HANDLING = (
    "aiohttp/web_protocol.py",
    "aiohttp/client.py",
    "aiohttp/client_reqrep.py",
    "aiohttp/connector.py",
    "aiohttp/web_app.py",
)
_PROXY_REQUEST_PATH = (
    "proxy/serve/relay.py",
    "proxy/core/headers.py",
    "proxy/core/request.py",
    "proxy/serve/app.py",
)
RECORD_AND_LOG = "proxy record + log line (assemble, record, stats, logs, structlog, metrics)"

# The labels keep the names of the flat layout the earlier results used (``proxy/sse.py``
# is now ``proxy/core/sse.py``, ``proxy/relay.py`` ``proxy/serve/relay.py``, ...).
CATEGORIES: list[tuple[str, Predicate]] = [
    ("proxy/tracker.py", lambda fn, f: f.endswith("proxy/core/tracker.py")),
    ("proxy/sse.py", lambda fn, f: f.endswith("proxy/core/sse.py")),
    ("orjson (native)", lambda fn, f: "orjson" in f),
    ("proxy/relay.py", lambda fn, f: f.endswith("proxy/serve/relay.py")),
    (RECORD_AND_LOG, lambda fn, f: any(s in f for s in _RECORD_AND_LOG)),
    (
        "aiohttp write path (StreamResponse.write, http_writer)",
        lambda fn, f: (
            "aiohttp/http_writer.py" in f
            or (
                "aiohttp/web_response.py" in f
                and fn.rsplit(".", 1)[-1] in ("write", "_write", "drain")
            )
        ),
    ),
    (
        "aiohttp read path (streams, client_proto, http parser)",
        lambda fn, f: any(s in f for s in _AIOHTTP_READ),
    ),
    (
        "aiohttp request handling (web_protocol, client request)",
        lambda fn, f: any(s in f for s in _AIOHTTP_HANDLING),
    ),
    (
        "asyncio transport write (incl. send)",
        lambda fn, f: (
            ("asyncio/selector_events.py" in f or "uvloop" in f)
            and fn.rsplit(".", 1)[-1] in ("write", "writelines")
        ),
    ),
    (
        "socket send (kernel, incl. loopback delivery)",
        lambda fn, f: fn in ("send", "sendmsg", "writev") and "libc" in f,
    ),
    (
        "timeouts (asyncio.timeout enter/exit, timer heap)",
        lambda fn, f: (
            "asyncio/timeouts.py" in f or (fn == "TimerHandle.__lt__" and "asyncio/events.py" in f)
        ),
    ),
]

_IDLE_LEAVES = frozenset({"epoll_wait", "epoll_pwait", "select_epoll_poll", "poll"})
_SYSCALLS = frozenset(
    {
        "send",
        "sendmsg",
        "sendto",
        "writev",
        "write",
        "recv",
        "recvfrom",
        "recvmsg",
        "read",
        "recv_into",
    }
)

# Self attribution: each sample goes to the first frame, from the leaf up, that matches one
# of these (in this order for that frame); the kernel side of loopback TCP is charged to send.
SELF_CATEGORIES: list[tuple[str, Predicate]] = [
    (
        "socket syscalls (send/recv; kernel loopback TCP)",
        lambda fn, f: fn in _SYSCALLS and ("libc" in f or "libpthread" in f),
    ),
    ("orjson (native)", lambda fn, f: "orjson" in f),
    ("proxy/sse.py", lambda fn, f: f.endswith("proxy/core/sse.py")),
    (
        "proxy/tracker.py (incl. its regex and dataclass calls)",
        lambda fn, f: f.endswith("proxy/core/tracker.py"),
    ),
    (RECORD_AND_LOG, lambda fn, f: any(s in f for s in _RECORD_AND_LOG)),
    (
        "proxy/relay.py, headers.py, request.py, app.py",
        lambda fn, f: any(f.endswith(x) for x in _PROXY_REQUEST_PATH),
    ),
    ("aiohttp", lambda fn, f: "aiohttp/" in f or "multidict" in f or "yarl" in f),
    ("asyncio event loop", lambda fn, f: "asyncio/" in f or "uvloop" in f),
]
OTHER = "other (interpreter, gc, ...)"


def _short(file: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def parse_line(line: str) -> tuple[list[Frame], int] | None:
    """``frame;frame;... count`` -> the frames (root first) and the count; None if malformed."""
    stack, _, count_s = line.rpartition(" ")
    if not stack or not count_s.isdigit():
        return None
    frames = []
    for fr in stack.split(";"):
        m = _FRAME.match(fr)
        func, file = (m.group("func"), m.group("file")) if m else (fr, "?")
        frames.append((func, _short(file)))
    return (frames, int(count_s)) if frames else None


def owner(frames: list[Frame]) -> str:
    """The self-time owner of a sample: the first known component from the leaf up."""
    for fn, f in reversed(frames):
        hit = next((n for n, pred in SELF_CATEGORIES if pred(fn, f)), None)
        if hit is not None:
            return hit
    return OTHER


@dataclass
class StackCounts:
    """Busy and idle samples, counted by leaf frame, by frame anywhere, by component."""

    total: int = 0
    idle: int = 0
    self_c: Counter[str] = field(default_factory=Counter)
    incl_c: Counter[str] = field(default_factory=Counter)
    cat_c: Counter[str] = field(default_factory=Counter)
    own_c: Counter[str] = field(default_factory=Counter)

    def add(self, frames: list[Frame], count: int) -> None:
        """Count ``count`` samples of the stack ``frames`` (idle when its leaf waits)."""
        if frames[-1][0] in _IDLE_LEAVES:
            self.idle += count
            return
        self.total += count
        self.self_c[f"{frames[-1][0]} ({frames[-1][1]})"] += count
        for key in {f"{fn} ({f})" for fn, f in frames}:
            self.incl_c[key] += count
        for name, pred in CATEGORIES:
            if any(pred(fn, f) for fn, f in frames):
                self.cat_c[name] += count
        self.own_c[owner(frames)] += count

    def shares(self, top: int) -> dict[str, Any]:
        """Percentages of the busy samples (rounded to 0.1)."""
        total = self.total
        if not total:
            return {"samples": 0, "idle_samples": self.idle}
        return {
            "samples": total,
            "idle_samples": self.idle,
            "self_by_category_pct": {
                n: round(100 * v / total, 1) for n, v in self.own_c.most_common()
            },
            "categories_inclusive_pct": {
                n: round(100 * self.cat_c[n] / total, 1) for n, _ in CATEGORIES
            },
            "top_self_pct": [
                (k, round(100 * v / total, 1)) for k, v in self.self_c.most_common(top)
            ],
            "top_inclusive_pct": [
                (k, round(100 * v / total, 1)) for k, v in self.incl_c.most_common(top * 2)
            ],
        }


def summarize_raw(path: Path, top: int = 20) -> dict[str, Any]:
    """Aggregate py-spy ``--format raw`` (collapsed stacks): self and inclusive shares of the
    busy samples (stacks whose leaf is epoll_wait are idle and left out)."""
    counts = StackCounts()
    for line in path.read_text().splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            counts.add(*parsed)
    return counts.shares(top)
