"""The variants ``explain`` sends for each prompt of the set, and every measurement kept.

For every tool prompt of the set (the bench's format and default set), a run sends these
variants back to back, and ``--runs N`` repeats the run:

* ``tools_cold``: the request as the set gives it, streamed, with ``cache_prompt: false``
  and ``timings_per_token`` (the server's clock at the first tool-call delta);
* ``no_tools_cold``: the same without its tools, cache cold, one token (prefill only);
* ``primer`` then ``tools_warm``: a request with the same tools and system turn but another
  last message, then the request itself, both cache on, one token each;
* ``raw_completion``: the request rendered by the served template (``/apply-template``) and
  completed on ``/completion`` for as many tokens as ``tools_cold`` decoded, temperature 0,
  cache cold: the same tokens without the tool path (no grammar, no tool-call parser);
* ``thinking_flip`` (where the template has a thinking switch): ``tools_cold`` with
  ``enable_thinking`` the other way;
* for a prompt with an image, where the server has a projector: ``image_cold`` and
  ``no_image_cold``, one token each.

Prefill-only variants ask for one token: their ``prompt_ms`` is the same as a full call's,
and the board spends its time on what is measured. The order of the first pair alternates
between runs, so a load that grows through a run does not favour one side. Nothing changes
a setting of the server: every variant is a request's own field.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.commands.bench import Prompt, PromptSet
from proxy.commands.explain.client import Http, Json
from proxy.core.dialects import CHAT_COMPLETIONS
from proxy.core.images import without_images
from proxy.core.schema import strip_tools

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "Measure",
    "Plan",
    "Server",
    "count_schema_tokens",
    "image_variants",
    "plan",
    "probe",
    "request_body",
    "tool_variants",
]

DEFAULT_MAX_TOKENS = 128
"""``max_tokens`` sent when the prompt set gives none (llama-server's default is unbounded)."""
PRIMER_TEXT = "Hello."
"""The primer's last message: another turn after the same tools and system turn."""


def _merge(body: Json, options: Json) -> None:
    """Options as the OpenAI SDK sends them: ``extra_body`` merged into the body."""
    for key, value in options.items():
        if key == "extra_body" and isinstance(value, dict):
            body.update(value)
        else:
            body[key] = value


def request_body(pset: PromptSet, prompt: Prompt, model: str) -> Json:
    """The prompt's request as bench sends it (without ``stream``), ``max_tokens`` always."""
    body: Json = {"model": model, "messages": prompt.messages}
    _merge(body, pset.options)
    if prompt.tools:
        _merge(body, pset.tool_options)
        body["tools"] = prompt.tools
    body.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    return body


def _thinking(body: Json) -> bool | None:
    kwargs = body.get("chat_template_kwargs")
    value = kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None
    return value if isinstance(value, bool) else None


def _with_thinking(body: Json, on: bool) -> Json:
    kwargs = body.get("chat_template_kwargs")
    return {**body, "chat_template_kwargs": {**(kwargs or {}), "enable_thinking": on}}


def _primer(body: Json) -> Json:
    """The same tools and system turn, another last message."""
    messages = list(body["messages"])
    messages[-1] = {"role": messages[-1].get("role", "user"), "content": PRIMER_TEXT}
    return {**body, "messages": messages, "max_tokens": 1, "cache_prompt": True}


def _image_parts(body: Json) -> list[Any]:
    finder = CHAT_COMPLETIONS.image_parts
    return finder(body) if finder is not None else []


@dataclass(slots=True)
class Server:
    """What the server says of itself: tool support, a thinking switch, a projector."""

    supports_tools: bool
    supports_tool_calls: bool
    vision: bool
    thinking_switch: bool = False

    def to_dict(self) -> Json:
        return {
            "supports_tools": self.supports_tools,
            "supports_tool_calls": self.supports_tool_calls,
            "thinking_switch": self.thinking_switch,
            "vision": self.vision,
        }


def probe(http: Http, tool_body: Json | None) -> Server:
    """``/props``, and whether ``enable_thinking`` changes the rendered tool prompt."""
    props = http.get("/props")
    caps = props.get("chat_template_caps") or {}
    server = Server(
        supports_tools=bool(caps.get("supports_tools")),
        supports_tool_calls=bool(caps.get("supports_tool_calls")),
        vision=bool((props.get("modalities") or {}).get("vision")),
    )
    if tool_body is not None and server.supports_tools:
        on, _ = http.post("/apply-template", _with_thinking(tool_body, True))
        off, _ = http.post("/apply-template", _with_thinking(tool_body, False))
        server.thinking_switch = on.get("prompt") != off.get("prompt")
    return server


@dataclass(slots=True)
class Plan:
    """The prompts and the variants each gets."""

    tool: list[Prompt]
    image: list[Prompt]
    thinking: bool

    def variants_per_run(self) -> int:
        per_tool = 5 + (1 if self.thinking else 0)
        return per_tool * len(self.tool) + 2 * len(self.image)


def plan(pset: PromptSet, model: str, server: Server) -> Plan:
    """The tool prompts, and the image prompts where the server has a projector."""
    tool = [p for p in pset.prompts if p.tools]
    image = [
        p for p in pset.prompts if server.vision and _image_parts(request_body(pset, p, model))
    ]
    return Plan(tool, image, server.thinking_switch)


@dataclass(slots=True)
class Measure:
    """Sends the variants and writes down every measurement."""

    http: Http
    step: Callable[[str], None]
    """Told of each measurement as it is kept (the progress bar)."""
    measurements: list[Json] = field(default_factory=list)

    def _keep(self, run: int, prompt: str, variant: str, path: str, **fields: Any) -> Json:
        entry = {"run": run, "prompt": prompt, "variant": variant, "path": path, **fields}
        self.measurements.append(entry)
        self.step(f"run {run} {prompt} {variant}")
        return entry

    def post(self, run: int, prompt: str, variant: str, path: str, body: Json) -> Json:
        t0 = time.perf_counter()
        answer, request_id = self.http.post(path, body)
        wall = (time.perf_counter() - t0) * 1000
        fields: Json = {"request_id": request_id, "wall_ms": round(wall, 3)}
        fields["timings"] = answer.get("timings") or {}
        if path == "/completion":
            fields.update(
                content=answer.get("content"),
                tokens_predicted=answer.get("tokens_predicted"),
                stop_type=answer.get("stop_type"),
            )
        return self._keep(run, prompt, variant, path, **fields)

    def stream(self, run: int, prompt: str, variant: str, body: Json) -> Json:
        t0 = time.perf_counter()
        seen, request_id = self.http.stream("/v1/chat/completions", body)
        wall = (time.perf_counter() - t0) * 1000
        call = {"name": seen.name, "arguments": seen.arguments} if seen.called else None
        return self._keep(
            run,
            prompt,
            variant,
            "/v1/chat/completions",
            request_id=request_id,
            wall_ms=round(wall, 3),
            timings=seen.timings,
            finish_reason=seen.finish_reason,
            call=call,
            before_call=seen.before_call,
            thinking=_thinking(body),
            reasoning_chars=len(seen.reasoning),
        )


def tool_variants(m: Measure, run: int, prompt: Prompt, body: Json, server: Server) -> None:
    """One run of a tool prompt's variants."""
    cold = {**body, "cache_prompt": False, "timings_per_token": True}
    bare = {**strip_tools(body), "cache_prompt": False, "max_tokens": 1}
    if run % 2:
        tools_cold = m.stream(run, prompt.name, "tools_cold", cold)
        m.post(run, prompt.name, "no_tools_cold", "/v1/chat/completions", bare)
    else:
        m.post(run, prompt.name, "no_tools_cold", "/v1/chat/completions", bare)
        tools_cold = m.stream(run, prompt.name, "tools_cold", cold)
    m.post(run, prompt.name, "primer", "/v1/chat/completions", _primer(body))
    warm = {**body, "cache_prompt": True, "max_tokens": 1}
    m.post(run, prompt.name, "tools_warm", "/v1/chat/completions", warm)
    rendered, _ = m.http.post("/apply-template", body)
    raw = {
        "prompt": rendered["prompt"],
        "n_predict": max(1, int(tools_cold["timings"].get("predicted_n") or 1)),
        "temperature": 0,
        "cache_prompt": False,
        **({"stop": body["stop"]} if "stop" in body else {}),
    }
    m.post(run, prompt.name, "raw_completion", "/completion", raw)
    if server.thinking_switch:
        flipped = _with_thinking(cold, _thinking(body) is False)
        m.stream(run, prompt.name, "thinking_flip", flipped)


def image_variants(m: Measure, run: int, prompt: Prompt, body: Json) -> None:
    """One run of an image prompt's pair, prefill only."""
    with_image = {**body, "cache_prompt": False, "max_tokens": 1}
    without = without_images(with_image, _image_parts(body))
    m.post(run, prompt.name, "image_cold", "/v1/chat/completions", with_image)
    m.post(run, prompt.name, "no_image_cold", "/v1/chat/completions", without)


def count_schema_tokens(http: Http, bodies: dict[str, Json]) -> dict[str, int]:
    """Input tokens with the tools less without, from the server's counting endpoint."""
    path = "/v1/chat/completions/input_tokens"
    out = {}
    for name, body in bodies.items():
        full, _ = http.post(path, body)
        bare, _ = http.post(path, strip_tools(body))
        out[name] = int(full["input_tokens"]) - int(bare["input_tokens"])
    return out
