"""Records of a benchmark client's traffic held to llama-server's own ``cache_n``.

AIPerf names no request the proxy can match one by one, so its records are taken in the
order the proxy had them, and each is checked against the server's ground truth alone: the
reusable prompt the proxy found (from llama-server's own rendering and tokenizer) less the
tokens llama-server kept (``cache_n``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.core.findings import LOST_MIN_TOKENS
from tests.conftest import proxy_in_front_of
from tests.third_party import AiperfLoad, gguf_tokenizer, run_aiperf

RECORD_WAIT_S = 60.0
SHARED_PROMPT_BURST = AiperfLoad(
    requests=16, entries=16, isl=24, osl=8, concurrency=4, system_tokens=300, warmup=1
)
"""Sixteen one-shot prompts behind a shared 300-token system prompt, four at a time, after
one warm-up request: on two slots, the first burst finds the prefix on one slot only."""


def aiperf_records(
    url: str, model: str, gguf: Path, folder: Path, load: AiperfLoad
) -> list[dict[str, Any]]:
    """AIPerf's ``load`` for ``model`` through a fresh proxy in front of the server at
    ``url`` (its tokenizer built from ``gguf``): every request succeeds; the proxy's records
    of them, in the order it had them."""
    with proxy_in_front_of(url, folder / "proxy") as proxy:
        requests = run_aiperf(proxy.url, model, gguf_tokenizer(gguf), folder / "aiperf", load)
        assert [r.error_message for r in requests if r.error is not None] == []
        wanted = load.requests + load.warmup
        records = proxy.records_of("/v1/chat/completions", wanted, within=RECORD_WAIT_S)
    assert len(records) == wanted
    return records


def causes_where_cache_n_lost(
    records: list[dict[str, Any]], causes: frozenset[str]
) -> list[dict[str, Any]]:
    """The records whose reusable prompt exceeds ``cache_n`` by at least
    ``LOST_MIN_TOKENS``, after checking that exactly these name a cause, one of ``causes``
    (what can happen on the server), with that difference as their loss, and that the others
    say nothing."""
    lost, seen = [], shown(records)
    for record in records:
        truth = record["reusable_tokens"] - record["cache_n"]
        if truth >= LOST_MIN_TOKENS:
            lost.append(record)
            assert record["prefill_cause"] in causes, seen
            assert record["cache_lost_tokens"] == truth, seen
        else:
            assert record["prefill_cause"] is None, seen
            assert record.get("prefill_lost_ms") is None, seen
    return lost


def shown(records: list[dict[str, Any]]) -> str:
    """The records' attribution, a line each, for a failure's message."""
    keys = ("conversation", "turn", "prefix_kind", "reusable_tokens", "cache_n")
    more = ("prefill_cause", "cache_lost_tokens")
    return "\n".join(str({k: r.get(k) for k in (*keys, *more)}) for r in records)
