"""Schema and tool-call accounting through the proxy, against a toy llama-server.

The toy renders a Qwen3-like prompt (the tools block sits in the system turn, before the first
user message) and makes one token of each word with the whitespace before it, plus one for BOS
when ``add_special`` is set. It counts the Responses and Messages APIs' prompts through a
conversion of its own. Every number the proxy reports is checked against the toy's own counts.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import zlib
from collections import Counter, defaultdict
from typing import Any, NamedTuple

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from proxy.core.record import Kind, Record
from proxy.core.schema import schema_hash
from proxy.serve.accounting import LookupFailed, error_message, estimate_tokens, failure_reason
from proxy.serve.app import ACCOUNTING
from proxy.serve.keys import MODEL_INFO, SETUP
from proxy.serve.metrics import per_model_page
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import DONE, SSE_HEADERS, chat_event, make_timings, typed_event

INPUT_TOKENS = "/v1/chat/completions/input_tokens"
RESPONSES_INPUT_TOKENS = "/v1/responses/input_tokens"
MESSAGES_COUNT_TOKENS = "/v1/messages/count_tokens"
APPLY_TEMPLATE = "/apply-template"
TOKENIZE = "/tokenize"
LOOKUP_PATHS = (
    INPUT_TOKENS,
    RESPONSES_INPUT_TOKENS,
    MESSAGES_COUNT_TOKENS,
    APPLY_TEMPLATE,
    TOKENIZE,
)
SCHEMA_COUNTS = 2 + 2
"""input_tokens calls for a new schema: with and without the tools, then the same for its
system turn alone (the check that the block's position holds for this request)."""
CHAT = "/v1/chat/completions"

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tool(name: str, *params: str) -> dict[str, Any]:
    """An OpenAI function tool taking string parameters ``params``."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name.replace('_', ' ')} tool of the coding agent.",
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string", "description": f"The {p}."} for p in params},
                "required": list(params),
            },
        },
    }


READ_FILE = tool("read_file", "path")
WRITE_FILE = tool("write_file", "path", "text")
RUN_SHELL = tool("run_shell", "command", "cwd", "timeout")
SYSTEM = "You are a careful coding agent working in a git repository."


def body_of(
    tools: list[Any],
    *,
    system: str | None = SYSTEM,
    user: str = "Show me /etc/hosts.",
    **extra: Any,
) -> dict[str, Any]:
    """A streamed chat request with ``tools``, an optional system prompt and a user message."""
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    body: dict[str, Any] = {
        "model": "qwen3",
        "messages": messages,
        "stream": True,
        "max_tokens": 64,
        **extra,
    }
    if tools:
        body["tools"] = tools
        body.setdefault("tool_choice", "auto")
    return body


# --------------------------------------------------------------------------------------------
# The toy llama-server


def render(body: dict[str, Any], header: str = TOOLS_HEADER) -> str:
    """The toy chat template: Qwen3's shape, tools as JSON lines in the system turn after
    ``header``."""
    rest = list(body.get("messages") or [])
    tools = body.get("tools") or []
    out: list[str] = []
    if tools:
        system = ""
        if rest and rest[0].get("role") in ("system", "developer"):
            system = str(rest.pop(0).get("content")) + "\n\n"
        block = "".join("\n" + json.dumps(t) for t in tools)
        out.append(f"<|im_start|>system\n{system}{header}{block}{TOOLS_FOOTER}<|im_end|>\n")
    for m in rest:
        out.append(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n")
    if body.get("add_generation_prompt", True):
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def toy_pieces(text: str) -> list[str]:
    """The toy's tokens as text: each word with the whitespace before it (trailing
    whitespace is a token of its own), so the pieces join into the text."""
    return re.findall(r"\s*\S+|\s+", text)


def toy_tokens(text: str, add_special: bool) -> list[int]:
    """One token per piece (its id a checksum of the piece: equal text, equal ids), after a
    BOS token when ``add_special``."""
    return ([1] if add_special else []) + [zlib.crc32(w.encode()) + 2 for w in toy_pieces(text)]


def from_responses(body: dict[str, Any]) -> dict[str, Any]:
    """The toy's own reading of a Responses body as chat: ``instructions`` and ``input``
    as messages, flat function tools nested with ``strict``."""
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    messages += [{"role": i["role"], "content": i.get("content")} for i in items or []]
    tools = [
        {
            "type": "function",
            "function": {k: v for k, v in t.items() if k != "type"} | {"strict": True},
        }
        for t in body.get("tools") or []
    ]
    return {"messages": messages, **({"tools": tools} if tools else {})}


def from_messages(body: dict[str, Any]) -> dict[str, Any]:
    """The toy's own reading of an Anthropic Messages body as chat."""
    system = [{"role": "system", "content": body["system"]}] if "system" in body else []
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema", {}),
            },
        }
        for t in body.get("tools") or []
    ]
    return {"messages": system + list(body["messages"]), **({"tools": tools} if tools else {})}


AS_CHAT = {
    INPUT_TOKENS: lambda body: body,
    RESPONSES_INPUT_TOKENS: from_responses,
    MESSAGES_COUNT_TOKENS: from_messages,
}


def input_tokens(body: dict[str, Any], header: str = TOOLS_HEADER) -> int:
    """What the toy's ``input_tokens`` endpoint answers for ``body``."""
    return len(toy_tokens(render(body, header), True))


def bare(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the tools and what goes with them."""
    return {
        k: v for k, v in body.items() if k not in ("tools", "tool_choice", "parallel_tool_calls")
    }


def expected_schema_tokens(body: dict[str, Any], header: str = TOOLS_HEADER) -> int:
    """The toy's own input_tokens(with tools) - input_tokens(without)."""
    return input_tokens(body, header) - input_tokens(bare(body), header)


def expected_layout(body: dict[str, Any]) -> tuple[int, int]:
    """Token positions ``[start, end)`` of the tools block in the toy's rendering of a chat
    body: the tokens that hold any character from the tools header (and the blank line that
    separates it from a system prompt) to the end of the tools footer; BOS is position 0."""
    text = render(body)
    start = text.index(TOOLS_HEADER)
    start -= 2 if text[start - 2 : start] == "\n\n" else 0
    end = text.index(TOOLS_FOOTER) + len(TOOLS_FOOTER)
    spans, at = [], 0
    for piece in toy_pieces(text):
        spans.append((at, at + len(piece)))
        at += len(piece)
    held = [i for i, (a, b) in enumerate(spans) if a < end and b > start]
    return 1 + held[0], 1 + held[-1] + 1


class ToyLlama:
    """A fake llama-server with the look-up endpoints, a toy tokenizer and switches."""

    def __init__(self) -> None:
        self.url = ""
        self.calls: Counter[str] = Counter()
        self.bodies: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        self.inflight = 0
        #: answer every look-up with this status (404: an old server; 500: a failure)
        self.lookup_status: int | None = None
        #: seconds each look-up path sleeps before answering
        self.delay_s: dict[str, float] = {}
        #: look-up paths that answer only once their event is set
        self.held: dict[str, asyncio.Event] = {}
        #: seconds the chat answer waits before its headers
        self.answer_delay_s = 0.0
        self.timings = make_timings(
            prompt_n=200, prompt_ms=400.0, predicted_n=9, predicted_ms=80.0, cache_n=0
        )
        #: the tool calls of the answer: (name, argument fragments); none means a text answer
        self.tool_calls: list[tuple[str, list[str]]] = []
        #: the body bytes of every chat answer sent
        self.sent: list[bytes] = []
        self.app = web.Application()
        for path in LOOKUP_PATHS:
            self.app.router.add_post(path, self._lookup)
        #: tokens added to every count of a counting endpoint (a converter unlike the toy's)
        self.count_skew: dict[str, int] = {}
        #: what /apply-template answered, in order
        self.rendered: list[str] = []
        for path in (CHAT, "/v1/responses", "/v1/messages"):  # answers in chat's shape
            self.app.router.add_post(path, self._chat)
        #: None: one model, a look-up's ``model`` ignored. Else a router's models, each with
        #: its tools header: a look-up without a known ``model`` is refused (400) as
        #: llama-server's router refuses it, and ``/props``, ``/v1/models`` and ``/metrics``
        #: answer as a router's do (404 with one model, as before)
        self.router: dict[str, str] | None = None
        #: the query of every request, by path
        self.queries: defaultdict[str, list[dict[str, str]]] = defaultdict(list)
        for path, handler in (
            ("/props", self._props),
            ("/v1/models", self._models),
            ("/metrics", self._metrics),
        ):
            self.app.router.add_get(path, handler)

    def lookups(self) -> int:
        """Look-up calls received so far, all paths together."""
        return sum(self.calls[p] for p in LOOKUP_PATHS)

    async def _lookup(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        path = request.path
        self.calls[path] += 1
        self.bodies[path].append(body)
        self.queries[path].append(dict(request.query))
        header, refused = self._routed(body.get("model"))
        if refused is not None:
            return refused
        self.inflight += 1
        try:
            if self.delay_s.get(path):
                await asyncio.sleep(self.delay_s[path])
            if path in self.held:
                await self.held[path].wait()
        finally:
            self.inflight -= 1
        if self.lookup_status is not None:
            err = {
                "error": {
                    "code": self.lookup_status,
                    "message": "toy says no",
                    "type": "not_found_error" if self.lookup_status == 404 else "server_error",
                }
            }
            return web.Response(
                status=self.lookup_status, body=orjson.dumps(err), content_type="application/json"
            )
        payload: dict[str, Any]
        if path == APPLY_TEMPLATE:
            payload = {"prompt": render(body, header)}
            self.rendered.append(payload["prompt"])
        elif path in AS_CHAT:
            count = input_tokens(AS_CHAT[path](body), header) + self.count_skew.get(path, 0)
            payload = {"input_tokens": count}
        else:
            content = str(body.get("content", ""))
            ids = toy_tokens(content, bool(body.get("add_special", False)))
            if body.get("with_pieces"):
                pieces = ([""] if body.get("add_special") else []) + toy_pieces(content)
                payload = {
                    "tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces, strict=True)]
                }
            else:
                payload = {"tokens": ids}
        return web.Response(body=orjson.dumps(payload), content_type="application/json")

    def _routed(self, model: Any) -> tuple[str, web.Response | None]:
        """The tools header of the body's ``model``, or a router's refusal of it."""
        if self.router is None:
            return TOOLS_HEADER, None
        if not isinstance(model, str) or not model:
            return TOOLS_HEADER, _refusal("model name is missing from the request")
        if model not in self.router:
            return TOOLS_HEADER, _refusal(f"model '{model}' not found")
        return self.router[model], None

    async def _props(self, request: web.Request) -> web.Response:
        self.queries[request.path].append(dict(request.query))
        if self.router is None:
            raise web.HTTPNotFound
        model = request.query.get("model")
        if model is None:
            return web.json_response({"role": "router", "model_alias": "llama-server"})
        _, refused = self._routed(model)
        caps = {"supports_tools": True, "supports_tool_calls": True}
        return refused or web.json_response({"model_alias": model, "chat_template_caps": caps})

    async def _models(self, request: web.Request) -> web.Response:
        self.queries[request.path].append(dict(request.query))
        if self.router is None:
            raise web.HTTPNotFound
        return web.json_response(
            {
                "data": [
                    {
                        "id": name,
                        "aliases": [],
                        "status": {"value": "loaded"},
                        "meta": {"size": MODEL_BYTES[name], "n_params": 2 * MODEL_BYTES[name]},
                    }
                    for name in self.router
                ]
            }
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        self.queries[request.path].append(dict(request.query))
        if self.router is None:
            raise web.HTTPNotFound
        _, refused = self._routed(request.query.get("model"))
        if refused is not None:
            return refused
        served = self.calls[CHAT]
        return web.Response(text=LLAMACPP_METRICS.format(prompt_tokens=served))

    def events(self) -> list[bytes]:
        """The SSE events of the next answer."""
        events = [chat_event({"role": "assistant", "content": None})]
        finish = "stop"
        if self.tool_calls:
            finish = "tool_calls"
            for i, (name, fragments) in enumerate(self.tool_calls):
                events.append(
                    chat_event(
                        {
                            "tool_calls": [
                                {
                                    "index": i,
                                    "id": f"call_{i}",
                                    "type": "function",
                                    "function": {"name": name, "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                for fragment in fragments:
                    events.append(
                        chat_event(
                            {"tool_calls": [{"index": i, "function": {"arguments": fragment}}]}
                        )
                    )
        else:
            events.append(chat_event({"content": "Here it is."}))
        events.append(chat_event({}, finish_reason=finish, timings=self.timings))
        events.append(DONE)
        return events

    def messages_events(self) -> list[bytes]:
        """The next answer as Anthropic Messages events: the counts in ``usage``, no timings."""
        t = self.timings
        start_usage = {"input_tokens": t["prompt_n"], "cache_read_input_tokens": t["cache_n"]}
        payloads: list[dict[str, Any]] = [
            {"type": "message_start", "message": {"role": "assistant", "usage": start_usage}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hi"},
            },
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": t["predicted_n"]},
            },
            {"type": "message_stop"},
        ]
        return [typed_event(p) for p in payloads]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        model = orjson.loads(await request.read()).get("model")
        self.calls[request.path] += 1
        events = self.messages_events() if request.path == "/v1/messages" else self.events()
        if self.router is not None:  # a router answers with the model it routed to
            served = b'"model":' + orjson.dumps(model)
            events = [e.replace(b'"model":"gemma-3-270m-q4_k_m.gguf"', served) for e in events]
        if self.answer_delay_s:
            await asyncio.sleep(self.answer_delay_s)
        resp = web.StreamResponse(status=200, headers=CIMultiDict(SSE_HEADERS))
        await resp.prepare(request)
        for event in events:
            await resp.write(event)
        await resp.write_eof()
        self.sent.append(b"".join(events))
        return resp


def _refusal(message: str) -> web.Response:
    """llama-server's 400 in its error shape."""
    error = {"code": 400, "message": message, "type": "invalid_request_error"}
    return web.json_response({"error": error}, status=400)


MODEL_BYTES = {"a": 1_000_000_000, "b": 2_000_000_000}
"""The toy router's models' sizes (``/v1/models`` ``meta.size``)."""
LLAMACPP_METRICS = (
    "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
    "# TYPE llamacpp:prompt_tokens_total counter\n"
    "llamacpp:prompt_tokens_total {prompt_tokens}\n"
    "# HELP llamacpp:requests_processing Number of requests processing.\n"
    "# TYPE llamacpp:requests_processing gauge\n"
    "llamacpp:requests_processing 0\n"
)
"""Part of llama-server's ``/metrics`` page (no labels, as it writes it)."""


@pytest.fixture
async def toy(aiohttp_server: Any) -> ToyLlama:
    """A started toy llama-server."""
    server_app = ToyLlama()
    server = await aiohttp_server(server_app.app)
    server_app.url = str(server.make_url("")).rstrip("/")
    return server_app


async def start(make_proxy: ProxyFactory, toy: ToyLlama, **accounting: Any) -> ProxyUnderTest:
    """The proxy in front of the toy, schema accounting on (prefix attribution off unless
    asked for: its own look-ups are counted in tests/serve/test_attribution.py)."""
    return await make_proxy(
        toy.url, accounting={"enabled": True, "attribution": False, **accounting}
    )


async def ask(
    proxy: ProxyUnderTest, body: dict[str, Any], path: str = CHAT
) -> tuple[int, bytes, float]:
    """POST ``body``; the status, the whole response body and the seconds until it was read."""
    t0 = time.monotonic()
    resp = await proxy.client.post(
        path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    data = await resp.read()
    return resp.status, data, time.monotonic() - t0


async def wait_record(proxy: ProxyUnderTest, count: int = 1, within: float = 5.0) -> Record:
    """The ``count``-th record, once the proxy has written it."""
    deadline = time.monotonic() + within
    while len(proxy.captured.records) < count:
        assert time.monotonic() < deadline, f"only {len(proxy.captured.records)} records"
        await asyncio.sleep(0.005)
    return proxy.captured.records[count - 1]


async def settle(toy: ToyLlama, quiet: float = 0.1, within: float = 5.0) -> None:
    """Wait until no look-up has arrived or been in flight for ``quiet`` seconds."""
    deadline = time.monotonic() + within
    seen, since = toy.lookups(), time.monotonic()
    while True:
        await asyncio.sleep(0.01)
        now = time.monotonic()
        if toy.lookups() != seen or toy.inflight:
            seen, since = toy.lookups(), now
        elif now - since >= quiet:
            return
        assert now < deadline, "the look-ups never settled"


async def schemas(proxy: ProxyUnderTest) -> Any:
    """The ``/stats`` ``schemas`` section."""
    resp = await proxy.admin.get("/stats")
    assert resp.status == 200
    return orjson.loads(await resp.read())["schemas"]


async def wait_per_tool(
    proxy: ProxyUnderTest, h: str, within: float = 3.0
) -> dict[str, int] | None:
    """``per_tool_tokens`` of schema ``h`` in ``/stats`` once known (None if never)."""
    deadline = time.monotonic() + within
    while True:
        entry = (await schemas(proxy))["by_hash"].get(h)
        if entry is not None and entry["per_tool_tokens"] is not None:
            per_tool: dict[str, int] = entry["per_tool_tokens"]
            return per_tool
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(0.02)


def expected_per_tool(body: dict[str, Any]) -> dict[str, int]:
    """Leave-one-out: the toy's count with every tool minus the count without that one."""
    tools = body["tools"]
    full = input_tokens(body)
    return {
        t["function"]["name"]: full - input_tokens({**body, "tools": tools[:i] + tools[i + 1 :]})
        for i, t in enumerate(tools)
    }


ARGS_FRAGMENTS = ['{"path": ', '"/etc/hosts", ', '"lines": "10"}']
ARGS = "".join(ARGS_FRAGMENTS)


# --------------------------------------------------------------------------------------------


class TestToyServer:
    def test_rendering_puts_tools_before_the_user(self) -> None:
        """The toy renders the tools block inside the system turn, before the first user turn."""
        text = render(body_of([READ_FILE]))
        assert text.index("# Tools") < text.index("</tools>") < text.index("<|im_start|>user")
        assert text.index(SYSTEM) < text.index("# Tools")
        assert "# Tools" not in render(bare(body_of([READ_FILE])))

    def test_schema_tokens_are_positive(self) -> None:
        """The toy's schema cost grows with the tools."""
        one = expected_schema_tokens(body_of([READ_FILE]))
        two = expected_schema_tokens(body_of([READ_FILE, WRITE_FILE]))
        assert 0 < one < two


class TestServerCounts:
    async def test_schema_tokens_from_the_server(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """schema_tokens is the server's input_tokens with tools minus without, source server."""
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE, WRITE_FILE, RUN_SHELL])
        status, _, _ = await ask(proxy, body)
        record = await wait_record(proxy)
        assert status == 200
        assert record.kind is Kind.TOOL
        assert record.accounting_error is None
        assert record.schema_tokens == expected_schema_tokens(body)
        assert record.schema_tokens_source == "server"
        assert record.schema_hash == schema_hash(body["tools"])
        assert record.schema_tools == 3

    async def test_lookups_send_the_request_body(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """input_tokens gets the body without stream options, once with and once without
        tools; the rendering with tools is tokenized once, into pieces, without BOS, naming
        the request's model."""
        proxy = await start(make_proxy, toy)
        body = body_of(
            [READ_FILE], stream_options={"include_usage": True}, parallel_tool_calls=False
        )
        await ask(proxy, body)
        await wait_record(proxy)
        await settle(toy)
        sent = toy.bodies[INPUT_TOKENS][:2]
        counted = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        assert sorted(sent, key=len) == [bare(counted), counted]
        assert toy.bodies[TOKENIZE] == [
            {
                "content": toy.rendered[0],
                "add_special": False,
                "parse_special": True,
                "with_pieces": True,
                "model": "qwen3",
            }
        ]

    async def test_per_tool_tokens_in_stats(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """Leave-one-out counts per tool name appear in /stats schemas.by_hash[hash]."""
        toy.delay_s[INPUT_TOKENS] = 0.05  # the record is written before the schema is known
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE, WRITE_FILE, RUN_SHELL])
        await ask(proxy, body)
        record = await wait_record(proxy)
        assert record.schema_hash is not None
        assert await wait_per_tool(proxy, record.schema_hash) == expected_per_tool(body)

    async def test_per_tool_tokens_when_lookups_beat_the_answer(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Per-tool counts appear even when the look-ups end before the model's answer does."""
        toy.answer_delay_s = 0.3  # a model is slower than three look-up round trips
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE, WRITE_FILE])
        await ask(proxy, body)
        record = await wait_record(proxy)
        await settle(toy)
        assert toy.calls[INPUT_TOKENS] == SCHEMA_COUNTS + 1 + 2  # then full + leave-one-out
        assert record.schema_hash is not None
        assert await wait_per_tool(proxy, record.schema_hash, within=0.5) == expected_per_tool(body)

    async def test_single_tool_per_tool_is_the_schema(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """With one tool its own cost is the schema's, and no extra look-up is made."""
        proxy = await start(make_proxy, toy)
        body = body_of([RUN_SHELL])
        await ask(proxy, body)
        record = await wait_record(proxy)
        assert record.schema_hash is not None
        assert await wait_per_tool(proxy, record.schema_hash, within=1.0) == {
            "run_shell": expected_schema_tokens(body)
        }
        await settle(toy)
        assert toy.calls[INPUT_TOKENS] == SCHEMA_COUNTS

    async def test_concurrent_requests_share_one_lookup(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Requests with the same schema in flight together wait on the same look-ups."""
        toy.delay_s[INPUT_TOKENS] = 0.1
        proxy = await start(make_proxy, toy)
        bodies = [body_of([READ_FILE], user=f"question {i}") for i in range(3)]
        await asyncio.gather(*(ask(proxy, b) for b in bodies))
        await wait_record(proxy, 3)
        await settle(toy)
        assert toy.calls[INPUT_TOKENS] == SCHEMA_COUNTS
        assert {r.schema_tokens for r in proxy.captured.records} == {
            expected_schema_tokens(bodies[0])
        }


class TestLookupCache:
    async def test_same_schema_is_not_looked_up_again(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A second request with the same tools and system prompt makes no schema look-up."""
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        first = await wait_record(proxy)
        await settle(toy)
        before = dict(toy.calls)
        await ask(
            proxy,
            body_of([READ_FILE], user="And /etc/resolv.conf?", max_tokens=512, temperature=0.7),
        )
        second = await wait_record(proxy, 2)
        await settle(toy)
        assert dict(toy.calls) == {**before, CHAT: before[CHAT] + 1}
        assert second.schema_tokens == first.schema_tokens
        assert second.schema_hash == first.schema_hash
        assert second.schema_tokens_source == "server"

    async def test_changed_system_prompt_is_looked_up(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A changed system prompt moves the tools block, so the schema is looked up again."""
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        first = await wait_record(proxy)
        await settle(toy)
        before = Counter(toy.calls)
        body = body_of([READ_FILE], system="You are a terse assistant.")
        await ask(proxy, body)
        second = await wait_record(proxy, 2)
        await settle(toy)
        assert toy.calls[INPUT_TOKENS] == before[INPUT_TOKENS] + SCHEMA_COUNTS
        assert toy.calls[APPLY_TEMPLATE] == before[APPLY_TEMPLATE] + 2
        assert second.schema_hash == first.schema_hash
        assert second.schema_tokens == expected_schema_tokens(body)

    async def test_changed_tools_are_looked_up(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Different tools are a different schema: new look-ups, another hash."""
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        first = await wait_record(proxy)
        await settle(toy)
        body = body_of([READ_FILE, WRITE_FILE])
        await ask(proxy, body)
        second = await wait_record(proxy, 2)
        assert second.schema_hash != first.schema_hash
        assert second.schema_tokens == expected_schema_tokens(body)
        assert set((await schemas(proxy))["by_hash"]) == {first.schema_hash, second.schema_hash}


class TestSchemaCost:
    async def test_cold_request_pays_every_schema_token(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """With nothing cached the schema costs schema_tokens * prompt_ms / prompt_n."""
        toy.timings = make_timings(prompt_n=250, prompt_ms=500.0, cache_n=0)
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE, WRITE_FILE])
        await ask(proxy, body)
        record = await wait_record(proxy)
        tokens = expected_schema_tokens(body)
        assert record.schema_cached is False
        assert record.schema_prefill_ms == pytest.approx(tokens * 500.0 / 250)
        assert record.schema_saved_ms == 0.0
        assert record.schema_prefilled_again is False

    async def test_warm_request_pays_nothing(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """With the cache past the block the schema is cached, costs 0 ms and saves the
        reference rate (from the cold request) per token."""
        toy.timings = make_timings(prompt_n=250, prompt_ms=500.0, cache_n=0)
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE, WRITE_FILE])
        await ask(proxy, body)
        await wait_record(proxy)
        toy.timings = make_timings(prompt_n=6, prompt_ms=30.0, cache_n=5000)
        await ask(proxy, body_of([READ_FILE, WRITE_FILE], user="And now?"))
        warm = await wait_record(proxy, 2)
        tokens = expected_schema_tokens(body)
        assert warm.schema_cached is True
        assert warm.schema_prefill_ms == 0.0
        assert warm.schema_saved_ms == pytest.approx(tokens * 2.0)
        assert warm.schema_prefilled_again is False
        entry = (await schemas(proxy))["by_hash"][warm.schema_hash]
        assert (entry["calls"], entry["cached"], entry["prefilled_again"]) == (2, 1, 0)
        assert entry["paid_ms"] == pytest.approx(tokens * 2.0, abs=0.01)
        assert entry["saved_ms"] == pytest.approx(tokens * 2.0, abs=0.01)

    @pytest.mark.parametrize(
        ("short_by", "cached"), [(0, True), (-3, True), (1, False), (10, False)]
    )
    async def test_cache_reach_at_the_block_end(
        self, toy: ToyLlama, make_proxy: ProxyFactory, short_by: int, cached: bool
    ) -> None:
        """A cache reaching the block's end covers it; stopping n positions short pays n of
        its span's positions, as a fraction of the schema tokens."""
        body = body_of([READ_FILE, WRITE_FILE])
        start_pos, end_pos = expected_layout(body)
        toy.timings = make_timings(prompt_n=100, prompt_ms=300.0, cache_n=end_pos - short_by)
        proxy = await start(make_proxy, toy)
        await ask(proxy, body)
        record = await wait_record(proxy)
        tokens = expected_schema_tokens(body)
        paid = tokens * max(0, short_by) / (end_pos - start_pos)
        assert record.schema_cached is cached
        assert record.schema_prefill_ms == pytest.approx(paid * 3.0, abs=0.002)


class TestPrefilledAgain:
    async def test_cold_again_is_flagged_counted_and_logged(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A known schema prefilled again (cache_n=0) sets the flag, counts in /stats and logs
        a schema_prefilled_again event."""
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE, WRITE_FILE])
        with capture_logs() as logs:
            await ask(proxy, body)
            first = await wait_record(proxy)
            await ask(proxy, body_of([READ_FILE, WRITE_FILE], user="Again, please."))
            second = await wait_record(proxy, 2)
        assert first.schema_prefilled_again is False
        assert second.schema_prefilled_again is True
        assert second.schema_cached is False
        doc = await schemas(proxy)
        assert doc["prefilled_again"] == 1
        assert doc["by_hash"][second.schema_hash]["prefilled_again"] == 1
        accounting = proxy.app[ACCOUNTING]
        assert accounting is not None
        assert accounting.prefilled_again == 1
        events = [e for e in logs if e["event"] == "schema_prefilled_again"]
        assert len(events) == 1
        assert events[0]["id"] == second.id
        assert events[0]["schema_hash"] == second.schema_hash
        assert events[0]["schema_tokens"] == expected_schema_tokens(body)
        assert events[0]["cache_n"] == 0

    async def test_warm_repeat_is_not_flagged(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A known schema served from the cache is not prefilled again."""
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        await wait_record(proxy)
        toy.timings = make_timings(prompt_n=6, prompt_ms=30.0, cache_n=5000)
        await ask(proxy, body_of([READ_FILE], user="Again."))
        second = await wait_record(proxy, 2)
        assert second.schema_prefilled_again is False
        assert (await schemas(proxy))["prefilled_again"] == 0


class TestToolArgs:
    async def test_args_tokens_from_the_server(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """tool_args_tokens is /tokenize's count of the streamed arguments (naming the
        request's model), source server, and tool_call_tokens is predicted_n."""
        toy.tool_calls = [("read_file", ARGS_FRAGMENTS)]
        toy.timings = make_timings(
            prompt_n=200, prompt_ms=400.0, predicted_n=17, predicted_ms=160.0
        )
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        record = await wait_record(proxy)
        assert record.finish_reason == "tool_calls"
        assert record.tool_calls == 1
        assert record.tool_args_tokens == len(toy_tokens(ARGS, False)) == 4
        assert record.tool_args_tokens_source == "server"
        assert record.tool_call_tokens == record.predicted_n == 17
        assert {
            "content": ARGS,
            "add_special": False,
            "parse_special": True,
            "model": "qwen3",
        } in toy.bodies[TOKENIZE]

    async def test_args_of_several_calls_are_summed(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Parallel calls' argument tokens add up."""
        other = '{"command": "ls -la /tmp", "cwd": "/", "timeout": "5"}'
        toy.tool_calls = [("read_file", ARGS_FRAGMENTS), ("run_shell", [other[:9], other[9:]])]
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE, RUN_SHELL]))
        record = await wait_record(proxy)
        assert record.tool_calls == 2
        assert record.tool_args_tokens == len(toy_tokens(ARGS, False)) + len(
            toy_tokens(other, False)
        )

    async def test_text_answer_has_no_args(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """A tool request answered with text has no tool-call fields and tokenizes no args."""
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        record = await wait_record(proxy)
        await settle(toy)
        assert record.finish_reason == "stop"
        assert record.tool_args_tokens is None
        assert record.tool_args_tokens_source is None
        assert record.tool_call_tokens is None
        assert all(b.get("with_pieces") for b in toy.bodies[TOKENIZE])  # the layout's only


class TestFallback:
    @pytest.mark.parametrize("status", [404, 405, 501])
    async def test_old_server_gives_estimates(
        self, toy: ToyLlama, make_proxy: ProxyFactory, status: int
    ) -> None:
        """Without the endpoints, schema and argument tokens are tiktoken estimates."""
        toy.lookup_status = status
        toy.tool_calls = [("read_file", ARGS_FRAGMENTS)]
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE, WRITE_FILE])
        status_code, _, _ = await ask(proxy, body)
        record = await wait_record(proxy)
        assert status_code == 200
        assert record.accounting_error is None
        assert record.schema_tokens_source == "estimate"
        assert record.schema_tokens == estimate_tokens(orjson.dumps(body["tools"]).decode())
        assert record.tool_args_tokens_source == "estimate"
        assert record.tool_args_tokens == estimate_tokens(ARGS)
        assert record.schema_cached is False  # cache_n=0: the whole estimate was paid
        assert record.schema_prefill_ms == pytest.approx(record.schema_tokens * 2.0)
        entry = (await schemas(proxy))["by_hash"][record.schema_hash]
        assert entry["source"] == "estimate"
        assert entry["per_tool_tokens"] is None

    async def test_estimate_without_layout_is_unknown_when_cached(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """An estimate has no block position, so with part of the prompt cached its cost is
        unknown."""
        toy.lookup_status = 404
        toy.timings = make_timings(prompt_n=10, prompt_ms=30.0, cache_n=120)
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        record = await wait_record(proxy)
        assert record.schema_tokens_source == "estimate"
        assert record.schema_cached is None
        assert record.schema_prefill_ms is None
        assert record.schema_saved_ms is None

    async def test_estimate_is_reused(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """An old server is not asked again for a schema it could not count."""
        toy.lookup_status = 404
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE]))
        await wait_record(proxy)
        await settle(toy)
        before = toy.lookups()
        await ask(proxy, body_of([READ_FILE], user="Again."))
        second = await wait_record(proxy, 2)
        await settle(toy)
        assert toy.lookups() == before
        assert second.schema_tokens_source == "estimate"


class TestFailure:
    async def test_failed_lookups_leave_nulls_and_the_answer_intact(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A 500 from the look-ups leaves the schema fields null with the reason named (the
        path, the status and llama-server's message), and the agent gets the fake's bytes
        unchanged."""
        toy.lookup_status = 500
        toy.tool_calls = [("read_file", ARGS_FRAGMENTS)]
        proxy = await start(make_proxy, toy)
        status, data, _ = await ask(proxy, body_of([READ_FILE]))
        record = await wait_record(proxy)
        assert status == 200
        assert data == toy.sent[0]
        assert record.outcome == "completed"
        for name in (
            "schema_hash",
            "schema_tools",
            "schema_tokens",
            "schema_tokens_source",
            "schema_cached",
            "schema_prefill_ms",
            "schema_saved_ms",
            "schema_prefilled_again",
            "tool_args_tokens",
            "tool_args_tokens_source",
        ):
            assert getattr(record, name) is None, name
        assert record.accounting_error is not None
        assert record.accounting_error == (
            f"schema: {INPUT_TOKENS} 500: toy says no; tool_args: {TOKENIZE} 500: toy says no"
        )
        assert record.tool_call_tokens == record.predicted_n  # from the stream, not look-ups

    async def test_failure_is_retried(self, toy: ToyLlama, make_proxy: ProxyFactory) -> None:
        """The next request with the same schema looks it up again, and then succeeds."""
        toy.lookup_status = 500
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE])
        await ask(proxy, body)
        await wait_record(proxy)
        await settle(toy)
        before = toy.calls[INPUT_TOKENS]
        toy.lookup_status = None
        await ask(proxy, body)
        second = await wait_record(proxy, 2)
        assert toy.calls[INPUT_TOKENS] > before
        assert second.accounting_error is None
        assert second.schema_tokens == expected_schema_tokens(body)
        assert second.schema_tokens_source == "server"

    async def test_unreachable_lookups_do_not_lose_the_record(
        self, make_proxy: ProxyFactory, unused_tcp_port: int
    ) -> None:
        """With the upstream down the agent gets a 502 and the record still arrives, with the
        look-up failure named."""
        proxy = await make_proxy(
            f"http://127.0.0.1:{unused_tcp_port}",
            accounting={"enabled": True, "lookup_timeout_s": 2.0},
        )
        status, _, _ = await ask(proxy, body_of([READ_FILE]))
        record = await wait_record(proxy)
        assert status == 502
        assert record.outcome == "upstream_unreachable"
        assert record.schema_tokens is None
        assert record.accounting_error is not None
        assert record.accounting_error.startswith("schema: ")


class TestHotPath:
    async def test_slow_lookups_do_not_delay_the_answer(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Look-ups that have not answered leave the agent's response whole; the record
        follows once they answer, complete."""
        held = toy.held[INPUT_TOKENS] = asyncio.Event()
        proxy = await start(make_proxy, toy, lookup_timeout_s=30.0)
        body = body_of([READ_FILE])
        try:
            status, data, _ = await ask(proxy, body)  # no count can have come back yet
            assert status == 200
            assert data == toy.sent[0]
            assert proxy.captured.records == []  # the record waits for the look-ups
        finally:
            held.set()
        record = await wait_record(proxy, within=5.0)
        assert record.accounting_error is None
        assert record.schema_tokens == expected_schema_tokens(body)

    async def test_lookup_timeout_names_the_failure(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Look-ups slower than lookup_timeout_s give a record with a timeout error, without
        waiting for them."""
        held = toy.held[INPUT_TOKENS] = asyncio.Event()
        proxy = await start(make_proxy, toy, lookup_timeout_s=0.3)
        try:  # the counts never come while the test runs: only the timeout ends the wait
            status, data, _ = await ask(proxy, body_of([READ_FILE]))
            assert status == 200
            assert data == toy.sent[0]
            record = await wait_record(proxy, within=5.0)
        finally:
            held.set()
        assert record.schema_tokens is None
        assert record.accounting_error == "schema: TimeoutError"


class TestNoTools:
    @pytest.mark.parametrize(
        "body",
        [
            pytest.param(body_of([]), id="no-tools"),
            pytest.param({**body_of([]), "tools": []}, id="empty-tools"),
        ],
    )
    async def test_chat_makes_no_lookups(
        self, toy: ToyLlama, make_proxy: ProxyFactory, body: dict[str, Any]
    ) -> None:
        """A chat request without tools triggers no look-up and no schema fields."""
        proxy = await start(make_proxy, toy)
        status, _, _ = await ask(proxy, body)
        record = await wait_record(proxy)
        await asyncio.sleep(0.1)
        assert status == 200
        assert record.kind is Kind.CHAT
        assert toy.lookups() == 0
        assert record.schema_tokens is None
        assert record.accounting_error is None
        assert (await schemas(proxy)) == {"prefilled_again": 0, "by_hash": {}, "evicted": 0}

    async def test_accounting_off_makes_no_lookups(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """With accounting off a tool request is relayed with no look-up and /stats says null."""
        proxy = await make_proxy(toy.url)
        await ask(proxy, body_of([READ_FILE]))
        record = await wait_record(proxy)
        await asyncio.sleep(0.1)
        assert record.kind is Kind.TOOL
        assert record.schema_tokens is None
        assert toy.lookups() == 0
        assert await schemas(proxy) is None


RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": name,
        "description": f"The {name} tool.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for name in ("read_file", "list_dir")
]
MESSAGES_TOOLS = [
    {
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    for name in ("read_file", "list_dir")
]
OTHER_APIS = [
    (
        "/v1/responses",
        RESPONSES_INPUT_TOKENS,
        {
            "model": "m",
            "instructions": SYSTEM,
            "input": "Show me /etc/hosts.",
            "tools": RESPONSES_TOOLS,
        },
    ),
    (
        "/v1/messages",
        MESSAGES_COUNT_TOKENS,
        {
            "model": "m",
            "max_tokens": 64,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": "Show me /etc/hosts."}],
            "tools": MESSAGES_TOOLS,
        },
    ),
]


class Api(NamedTuple):
    """One API's request to the toy, and the counting endpoint that prices it."""

    path: str
    count_path: str
    body: dict[str, Any]


@pytest.fixture(params=OTHER_APIS, ids=["responses", "messages"])
def api(request: pytest.FixtureRequest) -> Api:
    """The Responses API's and Anthropic Messages' tool requests in turn."""
    return Api(*request.param)


class TestOtherApis:
    """The Responses and Messages APIs are priced through their own counting endpoints."""

    async def test_schema_counted_by_the_apis_own_endpoint(
        self, toy: ToyLlama, make_proxy: ProxyFactory, api: Api
    ) -> None:
        """schema_tokens is the API's own count with the tools minus without them, per-tool
        counts are leave-one-out on that endpoint, and a cache that reaches the block's end
        (found through the request's Chat Completions form) counts the schema as cached."""
        chat = AS_CHAT[api.count_path](api.body)
        tokens = input_tokens(chat) - input_tokens(bare(chat))
        _, end = expected_layout(chat)
        toy.timings = make_timings(prompt_n=10, prompt_ms=50.0, cache_n=end)
        proxy = await start(make_proxy, toy)
        await ask(proxy, api.body, api.path)
        record = await wait_record(proxy)
        assert (record.kind, record.schema_tokens, record.schema_tokens_source) == (
            Kind.TOOL,
            tokens,
            "server",
        )
        assert (record.schema_cached, record.schema_prefill_ms) == (True, 0.0)
        assert record.schema_hash is not None
        names = [t["function"]["name"] for t in chat["tools"]]
        per_tool = {
            n: input_tokens(chat)
            - input_tokens(
                {**chat, "tools": [t for t in chat["tools"] if t["function"]["name"] != n]}
            )
            for n in names
        }
        assert await wait_per_tool(proxy, record.schema_hash) == per_tool
        await settle(toy)
        assert toy.calls[api.count_path] == 3 + 1 + 2  # with, without, system turn; per tool

    async def test_a_form_that_counts_otherwise_gives_no_position(
        self, toy: ToyLlama, make_proxy: ProxyFactory, api: Api
    ) -> None:
        """When the API's endpoint counts the system turn otherwise than its Chat
        Completions form does (a converter the proxy does not mirror), the block's position
        is not trusted: the schema count stands, and with a partly cached prompt whether the
        schema was cached is unknown, never guessed."""
        toy.count_skew[api.count_path] = 1
        toy.timings = make_timings(prompt_n=10, prompt_ms=50.0, cache_n=100)
        proxy = await start(make_proxy, toy)
        await ask(proxy, api.body, api.path)
        record = await wait_record(proxy)
        chat = AS_CHAT[api.count_path](api.body)
        assert record.schema_tokens == input_tokens(chat) - input_tokens(bare(chat))
        assert (record.schema_cached, record.schema_prefill_ms) == (None, None)
        assert record.accounting_error is None


# --------------------------------------------------------------------------------------------
# A router (llama-server with --models-dir): several models, routed by the body's ``model``

B_HEADER = TOOLS_HEADER + " Call them only when the answer needs them."
"""Model ``b``'s tools header: the same tools cost ``b`` more tokens than ``a``."""


def routed(toy: ToyLlama) -> None:
    """Make the toy a router serving ``a`` (the toy's header) and ``b`` (a longer one)."""
    toy.router = {"a": TOOLS_HEADER, "b": B_HEADER}


class TestLookupErrors:
    @pytest.mark.parametrize(
        ("body", "message"),
        [
            (b'{"error":{"code":400,"message":"model is not loaded"}}', "model is not loaded"),
            (b'{"error":"Loading model"}', "Loading model"),
            (b"upstream went\naway", "upstream went away"),
            (b'{"error":{"message":"' + b"x" * 400 + b'"}}', "x" * 159 + "\u2026"),
        ],
    )
    def test_the_message_is_llama_servers(self, body: bytes, message: str) -> None:
        """An error answer's message is llama-server's ``error.message`` (or its ``error``
        string, or the body's text), on one line and cut to 160 characters."""
        assert error_message(body) == message

    def test_a_failure_says_the_path_the_status_and_the_message(self) -> None:
        """A failed look-up reads ``path status: message``; another failure its type."""
        assert failure_reason(LookupFailed("/tokenize", 503, "Loading model")) == (
            "/tokenize 503: Loading model"
        )
        assert failure_reason(TimeoutError()) == "TimeoutError"

    async def test_a_routers_refusal_is_named(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A router refusing the look-ups of a model it does not serve: the record says the
        status and the router's message, for the schema and the arguments."""
        routed(toy)
        toy.tool_calls = [("read_file", ARGS_FRAGMENTS)]
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE], model="c"))
        record = await wait_record(proxy)
        assert record.schema_tokens is None and record.tool_args_tokens is None
        assert record.accounting_error == (
            f"schema: {INPUT_TOKENS} 400: model 'c' not found; "
            f"tool_args: {TOKENIZE} 400: model 'c' not found"
        )


class TestRouter:
    async def test_every_lookup_names_the_model(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """Against a router every look-up names the request's model (the counts, the
        renderings, every tokenization, the attribution's too), the counts are that model's
        own, and the arguments' tokens are asked without loading the model."""
        routed(toy)
        toy.tool_calls = [("read_file", ARGS_FRAGMENTS)]
        proxy = await start(make_proxy, toy, attribution=True)
        body = body_of([READ_FILE, WRITE_FILE], model="b")
        await ask(proxy, body)
        record = await wait_record(proxy)
        await settle(toy)
        assert record.accounting_error is None
        assert record.schema_tokens == expected_schema_tokens(body, B_HEADER)
        assert record.schema_tokens != expected_schema_tokens(body)
        assert record.tool_args_tokens == len(toy_tokens(ARGS, False))
        for path in LOOKUP_PATHS:
            assert all(b.get("model") == "b" for b in toy.bodies[path]), path
        assert len(toy.bodies[TOKENIZE]) == 4  # the layout's, BOS and the prompt's, the args'
        args = [
            q
            for b, q in zip(toy.bodies[TOKENIZE], toy.queries[TOKENIZE], strict=True)
            if b["content"] == ARGS
        ]
        assert args == [{"autoload": "false"}]

    async def test_schema_totals_are_kept_per_model(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A schema ``a`` paid for is new to ``b``: ``b``'s first request is not "prefilled
        again"; ``a`` paying for it again is. ``/stats`` keeps one entry per model."""
        routed(toy)
        proxy = await start(make_proxy, toy)
        body = body_of([READ_FILE])
        with capture_logs() as logs:
            for count, model in enumerate(("a", "b", "a"), start=1):
                await ask(proxy, {**body, "model": model})
                await wait_record(proxy, count)
        a, b, a_again = proxy.captured.records
        assert (a.schema_prefilled_again, b.schema_prefilled_again) == (False, False)
        assert a_again.schema_prefilled_again is True
        again = [e for e in logs if e["event"] == "schema_prefilled_again"]
        assert [(e["id"], e["model"]) for e in again] == [(a_again.id, "a")]
        h = schema_hash(body["tools"])
        by_hash = (await schemas(proxy))["by_hash"]
        assert sorted(by_hash) == [f"a/{h}", f"b/{h}"]
        for model, header, calls, paid_again in (("a", TOOLS_HEADER, 2, 1), ("b", B_HEADER, 1, 0)):
            entry = by_hash[f"{model}/{h}"]
            tokens = expected_schema_tokens({**body, "model": model}, header)
            assert (entry["model"], entry["hash"], entry["tokens"]) == (model, h, tokens)
            assert (entry["calls"], entry["prefilled_again"]) == (calls, paid_again)
            assert entry["per_tool_tokens"] == {"read_file": tokens}

    async def test_template_and_model_size_per_model(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A router's template is read per model (``/props?model=``, never loading one) and
        each record's roofline uses its own model's size from ``/v1/models``."""
        routed(toy)
        proxy = await start(make_proxy, toy)
        await proxy.app[SETUP].probe()  # what the proxy does at start
        for count, model in enumerate(("a", "b", "a", "b"), start=1):
            await ask(proxy, body_of([READ_FILE], model=model))
            await wait_record(proxy, count)
        await proxy.app[MODEL_INFO].settle()
        deadline = time.monotonic() + 3
        while len(proxy.app[SETUP].caps_by_model) < 2:
            assert time.monotonic() < deadline, "the models' templates were never read"
            await asyncio.sleep(0.01)
        resp = await proxy.admin.get("/stats")
        template = orjson.loads(await resp.read())["template"]
        caps = {"supports_tools": True, "supports_tool_calls": True}
        assert template["by_model"] == {"a": caps, "b": caps}
        assert sorted(q["model"] for q in toy.queries["/props"] if q) == ["a", "b"]
        assert all(q["autoload"] == "false" for q in toy.queries["/props"] if q)
        a, b = proxy.captured.records[2:]
        for record in (a, b):
            assert record.model in MODEL_BYTES and record.decode_tok_s is not None
            assert record.decode_gbs == round(
                MODEL_BYTES[record.model] * record.decode_tok_s / 1e9, 3
            )

    async def test_model_management_requests_read_no_props(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A router's model management requests (``POST /models`` to download one, load,
        unload) name a model they do not run: no ``/props?model=`` is read for them (such a
        read makes llama-server's router rescan and forget a model it just downloaded);
        a chat turn then reads its model's."""
        routed(toy)
        proxy = await start(make_proxy, toy)
        await proxy.app[SETUP].probe()  # what the proxy does at start
        manage = (("/models", "c"), ("/models/load", "b"), ("/models/unload", "a"))
        for count, (path, model) in enumerate(manage, start=1):
            await ask(proxy, {"model": model}, path)
            assert (await wait_record(proxy, count)).model == model
        await proxy.app[SETUP].settle()
        assert [q for q in toy.queries["/props"] if q] == []
        await ask(proxy, body_of([READ_FILE], model="a"))
        await wait_record(proxy, len(manage) + 1)
        deadline = time.monotonic() + 3
        while "a" not in proxy.app[SETUP].caps_by_model:
            assert time.monotonic() < deadline, "the chat turn's model was never read"
            await asyncio.sleep(0.01)
        assert [q for q in toy.queries["/props"] if q] == [{"model": "a", "autoload": "false"}]

    async def test_metrics_of_every_loaded_model_labelled(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """The admin ``/metrics`` holds a router's page of each loaded model (asked with
        ``?model=`` and ``autoload=false``), one family each, every sample labelled."""
        routed(toy)
        proxy = await start(make_proxy, toy)
        await ask(proxy, body_of([READ_FILE], model="a"))
        await wait_record(proxy)
        resp = await proxy.admin.get("/metrics")
        families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
        assert [s.value for s in families["timing_proxy_upstream_metrics_up"].samples] == [1.0]
        prompt = families["llamacpp:prompt_tokens"]
        assert prompt.type == "counter"
        assert [(s.labels, s.value) for s in prompt.samples] == [
            ({"model": "a"}, 1.0),
            ({"model": "b"}, 1.0),
        ]
        assert [s.labels for s in families["llamacpp:requests_processing"].samples] == [
            {"model": "a"},
            {"model": "b"},
        ]
        asked = [q for q in toy.queries["/metrics"] if q]
        assert asked == [{"model": m, "autoload": "false"} for m in ("a", "b")]


class TestOneModel:
    async def test_model_names_change_nothing_on_one_model(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """A single-model server serves every name with its one model: a schema paid again
        under another name is "prefilled again", ``/stats`` keeps one entry per hash with no
        model in it, and no page says anything per model."""
        proxy = await start(make_proxy, toy)
        await proxy.app[SETUP].probe()
        body = body_of([READ_FILE])
        for count, model in enumerate(("a", "b"), start=1):
            await ask(proxy, {**body, "model": model})
            await wait_record(proxy, count)
        first, second = proxy.captured.records
        assert (first.schema_prefilled_again, second.schema_prefilled_again) == (False, True)
        assert first.schema_tokens == second.schema_tokens == expected_schema_tokens(body)
        h = schema_hash(body["tools"])
        section = await schemas(proxy)
        assert list(section["by_hash"]) == [h]
        assert "model" not in section["by_hash"][h] and section["by_hash"][h]["calls"] == 2
        resp = await proxy.admin.get("/stats")
        assert "by_model" not in orjson.loads(await resp.read())["template"]
        resp = await proxy.admin.get("/metrics")
        assert "llamacpp" not in await resp.text()
        assert [q for q in toy.queries["/metrics"]] == [{}]  # asked once, as before

    async def test_per_tool_counts_agree_with_the_schema(
        self, toy: ToyLlama, make_proxy: ProxyFactory
    ) -> None:
        """The same tools cost more without a system message (the template's own system
        turn carries them); ``/stats`` shows the per-tool counts of the rendering its
        ``tokens`` came from, not of a later one."""
        proxy = await start(make_proxy, toy)
        with_system, without = body_of([RUN_SHELL]), body_of([RUN_SHELL], system=None)
        assert expected_schema_tokens(with_system) != expected_schema_tokens(without)
        for count, body in enumerate((with_system, without), start=1):
            await ask(proxy, body)
            await wait_record(proxy, count)
        await settle(toy)
        h = schema_hash(with_system["tools"])
        entry = (await schemas(proxy))["by_hash"][h]
        assert entry["tokens"] == expected_schema_tokens(with_system)
        assert entry["per_tool_tokens"] == {"run_shell": entry["tokens"]}


class TestPerModelPage:
    def test_pages_merge_into_one_family_each(self) -> None:
        """Two models' pages: each family's HELP and TYPE once, then both models' samples,
        labelled first among any labels they had, the label value escaped."""
        a = b'# HELP x_total X.\n# TYPE x_total counter\nx_total 3\n# TYPE g gauge\ng{slot="0"} 1\n'
        b = b"# HELP x_total X.\n# TYPE x_total counter\nx_total 5\n# TYPE g gauge\ng{} 2\n"
        page = per_model_page([("a", a), ('q"b', b)])
        assert page == (
            b"# HELP x_total X.\n# TYPE x_total counter\n"
            b'x_total{model="a"} 3\nx_total{model="q\\"b"} 5\n'
            b'# TYPE g gauge\ng{model="a",slot="0"} 1\ng{model="q\\"b"} 2\n'
        )
        families = {f.name: f for f in text_string_to_metric_families(page.decode())}
        assert [s.labels["model"] for s in families["x"].samples] == ["a", 'q"b']
