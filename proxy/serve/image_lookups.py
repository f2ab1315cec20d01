"""What a request's images add to its prompt, looked up beside the relay, and their price
once its timings are known (``docs/images.md``).

The request is counted with its image parts, without them, and without each in turn; where
each image's block sits comes from the request rendered with llama-server's media marker
(``/props``) and its text pieces tokenized; each image's own block from a turn holding only
that image (cached by the model and the image's content).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import aiohttp

from proxy.core.dialects import CHAT_COMPLETIONS, Dialect
from proxy.core.dialects.base import ImagePart
from proxy.core.images import (
    canonical_body,
    image_cost,
    image_spans,
    split_on_marker,
    without_images,
)
from proxy.core.partials import ImageFields
from proxy.core.record import Kind, Record
from proxy.core.request import RequestFacts
from proxy.core.schema import for_counting
from proxy.serve.lookups import (
    Lookups,
    Unsupported,
    failure_reason,
    joined,
    model_of,
    named,
    reusable,
)
from proxy.serve.tasks import spawn

__all__ = ["MAX_IMAGES_EACH", "ImageInfo", "ImageLookups", "image_parts_of"]

MAX_IMAGES_EACH = 8
"""Above this many images in one request, ``image_tokens_each`` is not counted (one more
count of the whole request per image)."""

_LAYOUT_ERRORS = (KeyError, ValueError, TypeError, aiohttp.ClientError, TimeoutError)


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


def image_parts_of(facts: RequestFacts) -> list[ImagePart]:
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


class ImageLookups:
    """Counts a request's images and finds their blocks; prices them for its record."""

    def __init__(self, lookups: Lookups, *, cache_entries: int = 1024) -> None:
        self._lookups = lookups
        self._max = cache_entries
        self._background: set[asyncio.Future[None]] = set()
        self._blocks: OrderedDict[tuple[str | None, str], asyncio.Task[int]] = OrderedDict()
        self._marker: dict[str | None, asyncio.Task[str]] = {}
        self._shell: dict[tuple[str | None, str], asyncio.Task[int]] = {}
        self._bos: dict[str | None, int] = {}

    def close(self) -> None:
        """Cancel the look-ups in flight."""
        for future in self._background:
            future.cancel()

    def begin(self, facts: RequestFacts, parts: list[ImagePart]) -> asyncio.Task[ImageInfo] | None:
        """Start the image look-ups of a chat or tool request with image ``parts``."""
        dialect = facts.dialect
        if not parts or facts.body is None or dialect.count_path is None:
            return None
        return spawn(self._images(dialect, for_counting(facts.body), parts), self._background)

    async def fields(
        self, record: Record, task: asyncio.Task[ImageInfo], images: int
    ) -> tuple[ImageFields, str | None]:
        """The image fields of ``record`` (of its ``images`` image parts), and why some are
        ``null`` (None: none are)."""
        # the counts, then the rendering, then the per-image counts: three rounds
        info, error = await joined(task, 3 * self._lookups.timeout_s)
        if info is None:
            return ImageFields(images=images), error
        cost = image_cost(
            info.spans, info.tokens, record.cache_n, record.prompt_n, record.prefill_ms
        )
        unknown = cost.cached is None and record.cache_n is not None
        return ImageFields(
            images=images,
            image_tokens=info.tokens,
            image_tokens_each=info.each,
            images_cached=cost.cached,
            image_prefill_ms=cost.prefill_ms,
        ), f"position unknown ({info.why})" if unknown else None

    async def _images(
        self, dialect: Dialect, counted: dict[str, Any], parts: list[ImagePart]
    ) -> ImageInfo:
        """The request counted with its images, without them, and without each in turn
        (several images); then where each image's block sits in the prompt."""
        assert dialect.count_path is not None
        path = dialect.count_path
        count = self._lookups.count
        n = len(parts)
        each_bodies = (
            [without_images(counted, parts, keep=[j for j in range(n) if j != i]) for i in range(n)]
            if 1 < n <= MAX_IMAGES_EACH
            else []
        )
        full, bare, *others = await asyncio.gather(
            count(path, counted),
            count(path, without_images(counted, parts)),
            *(count(path, b) for b in each_bodies),
        )
        tokens = full - bare
        each = [tokens] if n == 1 else [full - o for o in others] or None
        try:
            spans, why = await self._image_spans(dialect, counted, parts, full)
        except Unsupported:
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
        lookups = self._lookups
        checks = () if chat is counted else (lookups.count(chat_path, chat),)
        model = model_of(chat)
        marker, bos, rendered, *check = await asyncio.gather(
            self._media_marker(model),
            self._bos_tokens(model),
            lookups.post("/apply-template", chat),
            *checks,
        )
        if check and check[0] != full:
            return None, "chat form counts otherwise"
        pieces = split_on_marker(str(rendered["prompt"]), marker)
        if len(pieces) != len(parts) + 1:
            self._marker.pop(model, None)  # llama-server may have restarted with another marker
            return None, "media markers do not match the images"
        text = await asyncio.gather(*(lookups.tokens(p, False, model) for p in pieces))
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
            if task is None or not reusable(task):
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
        body = {**canonical_body(url), **named(model)}
        count, shell = await asyncio.gather(
            self._lookups.count(chat_path, body), self._shell_tokens(body, marker, bos, model)
        )
        return count - shell

    def _shell_tokens(
        self, body: dict[str, Any], marker: str, bos: int, model: str | None
    ) -> asyncio.Task[int]:
        """The tokens of a one-image turn's text (the same for every image), once per model
        and marker."""
        task = self._shell.get((model, marker))
        if task is None or not reusable(task):
            lookups = self._lookups

            async def shell() -> int:
                rendered = await lookups.post("/apply-template", body)
                pieces = split_on_marker(str(rendered["prompt"]), marker)
                if len(pieces) != 2:
                    raise ValueError("one media marker expected")
                counts = await asyncio.gather(*(lookups.tokens(p, False, model) for p in pieces))
                return bos + sum(counts)

            task = self._shell[(model, marker)] = spawn(shell(), self._background)
        return task

    async def _media_marker(self, model: str | None) -> str:
        """The model's media marker (``/props``): random per start of its server unless pinned."""
        task = self._marker.get(model)
        if task is None or not reusable(task):
            lookups = self._lookups

            async def marker() -> str:
                return str((await lookups.get("/props", model))["media_marker"])

            task = self._marker[model] = spawn(marker(), self._background)
        return await asyncio.shield(task)

    async def _bos_tokens(self, model: str | None) -> int:
        """Tokens the model's tokenizer adds before a prompt (BOS)."""
        if model not in self._bos:
            got = await self._lookups.post(
                "/tokenize", {"content": "", "add_special": True, **named(model)}
            )
            self._bos[model] = len(got["tokens"])
        return self._bos[model]
