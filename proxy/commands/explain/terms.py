"""From ``explain``'s measurements to the table's terms (the arithmetic is
:mod:`proxy.core.experiment`)."""

from __future__ import annotations

from proxy.commands.explain.client import Json
from proxy.commands.explain.variants import Server
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
    schema_term,
    thinking_term,
    unavailable,
)

__all__ = ["terms"]


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


def terms(measurements: list[Json], schema_tokens: dict[str, int], server: Server) -> list[Term]:
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


def _image_row(samples: list[ImageSample], server: Server) -> Term:
    if not server.vision:
        return unavailable("image", "no projector: /props modalities.vision is false")
    if not samples:
        return unavailable("image", "no prompt of the set has an image")
    return image_term(samples)
