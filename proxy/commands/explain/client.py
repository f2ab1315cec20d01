"""JSON over HTTP to the upstream ``explain`` measures, and what a streamed tool call showed."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from proxy.commands.errors import ExplainError
from proxy.core.experiment import ToolCallSeen
from proxy.core.headers import REQUEST_ID_HEADER

__all__ = ["ExplainError", "Http", "Json", "Streamed"]

Json = dict[str, Any]


@dataclass(slots=True)
class Streamed:
    """What a streamed Chat Completions tool request showed."""

    timings: Json = field(default_factory=dict)
    finish_reason: str | None = None
    name: str = ""
    arguments: str = ""
    called: bool = False
    before_call: Json | None = None
    """``predicted_n`` and ``predicted_ms`` (server clock) at the first tool-call delta."""
    reasoning: str = ""

    def see(self, chunk: Json) -> None:
        """Take one chunk of the stream into account."""
        timings = chunk.get("timings")
        if isinstance(timings, dict):
            self.timings = timings
        for choice in chunk.get("choices") or []:
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            delta = choice.get("delta") or {}
            self.reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                if call.get("index", 0) != 0:
                    continue
                if not self.called:
                    self.called = True
                    self.before_call = {
                        "predicted_n": self.timings.get("predicted_n"),
                        "predicted_ms": self.timings.get("predicted_ms"),
                    }
                function = call.get("function") or {}
                self.name += function.get("name") or ""
                self.arguments += function.get("arguments") or ""

    def call(self) -> ToolCallSeen | None:
        """The first call, or ``None``."""
        return ToolCallSeen.from_wire(self.name, self.arguments) if self.called else None


class Http:
    """JSON over HTTP to the upstream, with the proxy's request id when a proxy answers."""

    def __init__(self, base: str, timeout_s: float) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout_s

    def _open(self, path: str, body: Json | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            said = exc.read().decode(errors="replace").strip().splitlines()
            exc.close()
            raise ExplainError(
                f"{path} answered {exc.code} ({said[0][:200] if said else exc.reason})"
            ) from None
        except OSError as exc:
            raise ExplainError(f"cannot reach {self.base}{path}: {exc}") from None

    def get(self, path: str) -> Json:
        with self._open(path, None) as resp:
            found: Json = json.loads(resp.read())
            return found

    def post(self, path: str, body: Json) -> tuple[Json, str | None]:
        with self._open(path, body) as resp:
            found: Json = json.loads(resp.read())
            return found, resp.headers.get(REQUEST_ID_HEADER)

    def stream(self, path: str, body: Json) -> tuple[Streamed, str | None]:
        seen = Streamed()
        with self._open(path, {**body, "stream": True}) as resp:
            request_id = resp.headers.get(REQUEST_ID_HEADER)
            for raw in resp:
                line = raw.strip()
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    seen.see(json.loads(line[6:]))
        return seen, request_id
