"""``timing-proxy explain``: an experiment against a running llama-server that measures what
each cause behind a tool call's time costs on this board, and so what each fix would save.

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
a setting of the server: every variant is a request's own field. The arithmetic (paired
differences, their spread, the noise rule) is :mod:`proxy.core.experiment`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from proxy.commands.bench import Prompt, PromptSet
from proxy.core.dialects import CHAT_COMPLETIONS
from proxy.core.experiment import (
    CacheSample,
    DecodeSample,
    ImageSample,
    SchemaSample,
    Term,
    ThinkingSample,
    ToolCallSeen,
    cache_term,
    decode_term,
    image_term,
    raw_call,
    render_table,
    schema_term,
    thinking_term,
    unavailable,
)
from proxy.core.headers import REQUEST_ID_HEADER
from proxy.core.images import without_images
from proxy.core.schema import strip_tools
from proxy.core.timestamps import iso_utc

__all__ = ["ExplainError", "ExplainOptions", "run_explain"]

DEFAULT_MAX_TOKENS = 128
"""``max_tokens`` sent when the prompt set gives none (llama-server's default is unbounded)."""
PRIMER_TEXT = "Hello."
"""The primer's last message: another turn after the same tools and system turn."""
Json = dict[str, Any]


class ExplainError(RuntimeError):
    """The experiment cannot run (the message is one line and says what to do)."""


@dataclass(frozen=True, slots=True)
class ExplainOptions:
    """What ``timing-proxy explain`` was asked to do."""

    upstream: str
    prompts: PromptSet
    runs: int = 3
    model: str = "default"
    json_path: str | None = None
    timeout_s: float = 900.0


# -- HTTP -----------------------------------------------------------------------------------


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


class _Http:
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


# -- request bodies -------------------------------------------------------------------------


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


# -- the experiment -------------------------------------------------------------------------


@dataclass(slots=True)
class _Server:
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


def _probe(http: _Http, tool_body: Json | None) -> _Server:
    props = http.get("/props")
    caps = props.get("chat_template_caps") or {}
    server = _Server(
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
class _Plan:
    """The prompts and the variants each gets."""

    tool: list[Prompt]
    image: list[Prompt]
    thinking: bool

    def variants_per_run(self) -> int:
        per_tool = 5 + (1 if self.thinking else 0)
        return per_tool * len(self.tool) + 2 * len(self.image)


class _Progress:
    """A bar with what is left, estimated from the requests done so far."""

    def __init__(self, out: IO[str] | None, total: int) -> None:
        self.out, self.total, self.done = out, total, 0
        self.started = time.monotonic()

    def step(self, label: str) -> None:
        self.done += 1
        if self.out is None:
            return
        width = 30
        filled = width * self.done // self.total
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.total - self.done)
        self.out.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{label:<34} ~{_duration(left)} left "
        )
        if self.done == self.total:
            self.out.write("\n")
        self.out.flush()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@dataclass(slots=True)
class _Measure:
    """Sends the variants and writes down every measurement."""

    http: _Http
    progress: _Progress
    measurements: list[Json] = field(default_factory=list)

    def _keep(self, run: int, prompt: str, variant: str, path: str, **fields: Any) -> Json:
        entry = {"run": run, "prompt": prompt, "variant": variant, "path": path, **fields}
        self.measurements.append(entry)
        self.progress.step(f"run {run} {prompt} {variant}")
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


def _tool_variants(m: _Measure, run: int, prompt: Prompt, body: Json, server: _Server) -> None:
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


def _image_variants(m: _Measure, run: int, prompt: Prompt, body: Json) -> None:
    """One run of an image prompt's pair, prefill only."""
    with_image = {**body, "cache_prompt": False, "max_tokens": 1}
    without = without_images(with_image, _image_parts(body))
    m.post(run, prompt.name, "image_cold", "/v1/chat/completions", with_image)
    m.post(run, prompt.name, "no_image_cold", "/v1/chat/completions", without)


# -- from measurements to terms -------------------------------------------------------------


def _by_pair(measurements: list[Json]) -> dict[tuple[int, str], dict[str, Json]]:
    pairs: dict[tuple[int, str], dict[str, Json]] = {}
    for entry in measurements:
        pairs.setdefault((entry["run"], entry["prompt"]), {})[entry["variant"]] = entry
    return pairs


def _ms(entry: Json, key: str = "prompt_ms") -> float:
    return float(entry["timings"].get(key) or 0.0)


def _n(entry: Json, key: str) -> int:
    return int(entry["timings"].get(key) or 0)


def _chat_call(entry: Json) -> ToolCallSeen | None:
    call = entry.get("call")
    return ToolCallSeen.from_wire(call["name"], call["arguments"]) if call else None


def _before(entry: Json) -> tuple[float, int, bool]:
    """Decode ms and tokens before the first call (before the end when none came)."""
    seen = entry.get("before_call")
    if seen and seen.get("predicted_n") is not None:
        return float(seen.get("predicted_ms") or 0.0), int(seen["predicted_n"]), True
    return _ms(entry, "predicted_ms"), _n(entry, "predicted_n"), False


def _thinking_sample(variants: dict[str, Json]) -> ThinkingSample:
    base, flip = variants["tools_cold"], variants["thinking_flip"]
    on, off = (flip, base) if base.get("thinking") is False else (base, flip)
    on_ms, on_tokens, on_called = _before(on)
    off_ms, off_tokens, off_called = _before(off)
    return ThinkingSample(on_ms, on_tokens, on_called, off_ms, off_tokens, off_called)


def _decode_sample(cold: Json, raw: Json) -> DecodeSample:
    return DecodeSample(
        chat_call=_chat_call(cold),
        chat_tokens=_n(cold, "predicted_n"),
        chat_decode_ms=_ms(cold, "predicted_ms"),
        chat_tok_s=cold["timings"].get("predicted_per_second"),
        raw_call=raw_call(str(raw.get("content") or "")),
        raw_tokens=_n(raw, "predicted_n"),
        raw_decode_ms=_ms(raw, "predicted_ms"),
        raw_tok_s=raw["timings"].get("predicted_per_second"),
    )


def terms(measurements: list[Json], schema_tokens: dict[str, int], server: _Server) -> list[Term]:
    """The table's rows from every measurement (``schema_tokens`` by prompt name)."""
    schema, cache, decode, thinking, image = [], [], [], [], []
    for (_, prompt), v in sorted(_by_pair(measurements).items()):
        if "tools_cold" in v and "no_tools_cold" in v:
            cold = v["tools_cold"]
            schema.append(
                SchemaSample(
                    _ms(cold), _n(cold, "prompt_n"), _ms(v["no_tools_cold"]), schema_tokens[prompt]
                )
            )
            call_ms = _ms(cold) + _ms(cold, "predicted_ms")
            warm = v["tools_warm"]
            cache.append(CacheSample(_ms(cold), _ms(warm), call_ms, _n(warm, "cache_n")))
            decode.append(_decode_sample(cold, v["raw_completion"]))
            if "thinking_flip" in v:
                thinking.append(_thinking_sample(v))
        if "image_cold" in v:
            with_image, without = v["image_cold"], v["no_image_cold"]
            tokens = _n(with_image, "prompt_n") - _n(without, "prompt_n")
            image.append(ImageSample(_ms(with_image), _ms(without), tokens))
    rows = [schema_term(schema), cache_term(cache), decode_term(decode)]
    rows.append(
        thinking_term(thinking)
        if server.thinking_switch
        else unavailable("thinking", "no thinking switch: enable_thinking renders the same prompt")
    )
    rows.append(_image_row(image, server))
    return rows


def _image_row(samples: list[ImageSample], server: _Server) -> Term:
    if not server.vision:
        return unavailable("image", "no projector: /props modalities.vision is false")
    if not samples:
        return unavailable("image", "no prompt of the set has an image")
    return image_term(samples)


# -- the command ----------------------------------------------------------------------------


def _plan(pset: PromptSet, model: str, server: _Server) -> _Plan:
    tool = [p for p in pset.prompts if p.tools]
    image = [
        p for p in pset.prompts if server.vision and _image_parts(request_body(pset, p, model))
    ]
    return _Plan(tool, image, server.thinking_switch)


def _schema_tokens(http: _Http, bodies: dict[str, Json]) -> dict[str, int]:
    """Input tokens with the tools less without, from the server's counting endpoint."""
    path = "/v1/chat/completions/input_tokens"
    out = {}
    for name, body in bodies.items():
        full, _ = http.post(path, body)
        bare, _ = http.post(path, strip_tools(body))
        out[name] = int(full["input_tokens"]) - int(bare["input_tokens"])
    return out


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - no load average on this platform
        return None


def _header(opts: ExplainOptions, plan: _Plan, load: list[float] | None) -> str:
    where = f"explain: {opts.upstream}, {opts.runs} run(s) of {len(plan.tool)} tool prompt(s)"
    if plan.image:
        where += f" and {len(plan.image)} image prompt(s)"
    return f"{where}\n{_load_line(load, 'at start')}\n"


def _load_line(load: list[float] | None, when: str) -> str:
    cpus = os.cpu_count()
    if load is None:
        return f"machine: {cpus} CPUs, load average unknown"
    return f"machine: {cpus} CPUs, load average {load[0]} / {load[1]} / {load[2]} {when}"


def run_explain(
    opts: ExplainOptions,
    *,
    progress: IO[str] | None = sys.stderr,
    say: Callable[[str], None] = print,
) -> Json:
    """Run the experiment; prints the table and returns the document (also ``--json``)."""
    if opts.runs < 1:
        raise ExplainError("--runs must be at least 1")
    started = iso_utc()
    http = _Http(opts.upstream, opts.timeout_s)
    bodies = {p.name: request_body(opts.prompts, p, opts.model) for p in opts.prompts.prompts}
    first_tool = next((bodies[p.name] for p in opts.prompts.prompts if p.tools), None)
    server = _probe(http, first_tool)
    plan = _plan(opts.prompts, opts.model, server)
    if not plan.tool and not plan.image:
        raise ExplainError("the prompt set has no tool prompt (and no image prompt to measure)")
    if plan.tool and not server.supports_tools:
        raise ExplainError(
            "the served chat template has no tool support (/props chat_template_caps."
            "supports_tools false): tools never reach the model; start llama-server with a "
            "tool-capable template (--jinja with the model's own, or --chat-template-file)"
        )
    tool_bodies = {p.name: bodies[p.name] for p in plan.tool}
    schema_tokens = _schema_tokens(http, tool_bodies)
    load_start = _load()
    say(_header(opts, plan, load_start))
    m = _Measure(http, _Progress(progress, plan.variants_per_run() * opts.runs))
    for run in range(1, opts.runs + 1):
        for prompt in plan.tool:
            _tool_variants(m, run, prompt, tool_bodies[prompt.name], server)
        for prompt in plan.image:
            _image_variants(m, run, prompt, bodies[prompt.name])
    rows = terms(m.measurements, schema_tokens, server)
    load_end = _load()
    say(render_table(rows) + _load_line(load_end, "at the end"))
    doc: Json = {
        "started": started,
        "upstream": opts.upstream,
        "model": opts.model,
        "runs": opts.runs,
        "load": {"cpus": os.cpu_count(), "start": load_start, "end": load_end},
        "server": server.to_dict(),
        "schema_tokens": schema_tokens,
        "terms": [row.to_dict() for row in rows],
        "measurements": m.measurements,
    }
    if opts.json_path:
        Path(opts.json_path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return doc
