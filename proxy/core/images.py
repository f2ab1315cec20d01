"""Image-token accounting arithmetic. Pure: the look-ups live in :mod:`proxy.serve.image_lookups`.

An image in a request (a Chat Completions ``image_url`` part, a Responses ``input_image``, a
Messages ``image`` block: each dialect's ``image_parts`` finds them) reaches the model as a
*media chunk*: llama-server renders the chat template with a media marker where the image
goes, and its multimodal tokenizer (``mtmd``) cuts the text at each marker, tokenizes the
pieces between markers on their own, and puts between them the image's block: the
projector's begin tokens, the image's embeddings (one chunk of ``n`` positions), its end
tokens. So, in tokens, the prompt is::

    BOS  tok(text_0)  block_1  tok(text_1)  block_2 ...  tok(text_k)

and image ``i``'s block starts at ``BOS + sum(tok(text_j), j < i) + sum(block_j, j < i)``
(:func:`image_spans`). The prompt cache never ends inside an image's chunk (llama-server
refuses to cut one), so an image is either served from the cache or prefilled whole; only
the block's few text tokens around the chunk can fall on either side (:func:`image_cost`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.dialects.base import ImagePart, chat_image_part

__all__ = [
    "ImageCost",
    "canonical_body",
    "image_cost",
    "image_spans",
    "split_on_marker",
    "without_images",
]


def without_images(
    body: dict[str, Any], parts: Sequence[ImagePart], keep: Sequence[int] = ()
) -> dict[str, Any]:
    """A copy of ``body`` with the image ``parts`` removed, except those whose index in
    ``parts`` is in ``keep``. A list left empty gets one empty text part of its own type in
    their place (a Messages turn with no block left would otherwise vanish from the prompt).
    ``body`` is not changed: the dicts and lists on the parts' paths are copied, the rest
    shared."""
    kept = set(keep)
    out = dict(body)
    fresh = {id(out)}
    removed = [part for n, part in enumerate(parts) if n not in kept]
    # from the back, so that the indices of the parts still to remove stay valid
    for part in sorted(removed, key=lambda p: _sort_key(p.path), reverse=True):
        with contextlib.suppress(LookupError, TypeError):
            _remove(out, part, fresh)
    return out


def _sort_key(path: tuple[str | int, ...]) -> tuple[tuple[int, int, str], ...]:
    return tuple((0, s, "") if isinstance(s, int) else (1, 0, s) for s in path)


def _remove(root: dict[str, Any], part: ImagePart, fresh: set[int]) -> None:
    node: Any = root
    for step in part.path[:-1]:
        child = node[step]
        if id(child) not in fresh:
            child = list(child) if isinstance(child, list) else dict(child)
            node[step] = child
            fresh.add(id(child))
        node = child
    index = part.path[-1]
    if not isinstance(node, list) or not isinstance(index, int):
        raise TypeError(part.path)
    del node[index]
    if not node:
        node.append({"type": part.text_type, "text": ""})


def canonical_body(url: str) -> dict[str, Any]:
    """The Chat Completions body of one user turn holding only the image at ``url``: its
    input tokens less those of its text are the image's block, whatever surrounds it in a
    request (``mtmd`` tokenizes the text on either side of a marker on its own)."""
    return {"messages": [{"role": "user", "content": [chat_image_part(url)]}]}


def split_on_marker(text: str, marker: str) -> list[str]:
    """``text`` cut at each media ``marker``: one more piece than there are markers."""
    return text.split(marker) if marker else [text]


def image_spans(
    bos: int, text_tokens: Sequence[int], blocks: Sequence[int]
) -> list[tuple[int, int]] | None:
    """Each image's block as token positions ``[start, end)`` in the prompt, from the BOS
    count, the tokens of each text piece between markers (one more than there are images)
    and each image's block size. None when the counts do not fit together."""
    if len(text_tokens) != len(blocks) + 1 or bos < 0 or any(n < 0 for n in text_tokens):
        return None
    if any(b <= 0 for b in blocks):
        return None
    spans: list[tuple[int, int]] = []
    position = bos
    for text, block in zip(text_tokens, blocks, strict=False):
        position += text
        spans.append((position, position + block))
        position += block
    return spans


@dataclass(frozen=True, slots=True)
class ImageCost:
    """What a request's images cost it."""

    cached: int | None
    """Images whose whole block the prompt cache covered."""
    prefilled_tokens: int | None
    """Tokens of the images' blocks at positions ``>= cache_n``: prefilled this request."""
    prefill_ms: float | None
    """``prefilled_tokens`` x this request's ``prefill_ms / prompt_n``; 0.0 when none were."""


def image_cost(
    spans: Sequence[tuple[int, int]] | None,
    image_tokens: int | None,
    cache_n: int | None,
    prompt_n: int | None,
    prefill_ms: float | None,
) -> ImageCost:
    """Price a request's images from the prompt cache's reach (``cache_n``).

    The block tokens at positions ``>= cache_n`` were prefilled this request, each at this
    request's ``prefill_ms / prompt_n``. An image counts as cached when ``cache_n`` reaches
    its block's end. Without ``spans`` the positions are unknown: the cost is then known
    only when nothing was cached (every one of the ``image_tokens`` was prefilled). Without
    the request's prefill time (the Messages API sends no ``timings``) the split in tokens
    stands, and the time is known only when it is 0.
    """
    if cache_n is None:
        return ImageCost(None, None, None)
    if spans is None:
        if cache_n > 0 or image_tokens is None:
            return ImageCost(None, None, None)
        return ImageCost(0, image_tokens, _priced(image_tokens, prompt_n, prefill_ms))
    cached = sum(1 for _, end in spans if cache_n >= end)
    prefilled = sum(max(0, end - max(start, cache_n)) for start, end in spans)
    return ImageCost(cached, prefilled, _priced(prefilled, prompt_n, prefill_ms))


def _priced(tokens: int, prompt_n: int | None, prefill_ms: float | None) -> float | None:
    if tokens == 0:
        return 0.0
    if prefill_ms is None or not prompt_n:
        return None
    return round(tokens * prefill_ms / prompt_n, 3)
