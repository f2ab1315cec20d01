"""Real agent traffic replayed through the proxy against the real llama-server: every
conclusion of prefix attribution checked against the ground truth.

The corpus (``tests/corpus/*.json``, recorded by ``python -m tests.corpus.record``) holds the
requests real clients sent (the OpenAI SDK, the OpenAI Agents SDK on both its models,
LangChain, the Anthropic SDK) in scenarios of agent traffic, each with what the proxy must
conclude of each request and why. Each scenario is replayed, byte-identical bodies in order,
through a fresh proxy in front of a llama-server whose slots were just erased: ``full`` (one
slot, ``--swa-full --cache-ram 0``), ``swa`` (one slot, ``--cache-ram 0``, Gemma 3's sliding
window) or ``swa2`` (the same with two slots).

Per request the record must hold the expected ``prefix_kind``, ``prefill_cause``,
``cache_lost_cause``, ``diverged_section``, ``attribution_error``, ``conversation`` (the
scenario's names of its conversations must map one to one onto the proxy's) and ``turn``,
the ``reusable_tokens`` of the spec, and lose within 2 tokens of the truth. The truth is
computed here from llama-server alone (``tests/corpus/truth.py``: its renderings, its
tokenizer, the counts in its responses), never from the proxy's code, and checks the
corpus's hand-written expectations too: a rewrite's position, a cold prompt's, the section
at the divergence, a cache loss that must (or must not) reach 16 tokens in this run.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.commands.provision import LlamaServer
from proxy.core.headers import REQUEST_ID_HEADER
from proxy.serve.accounting import REFERENCE_MIN_TOKENS
from tests.conftest import proxy_in_front_of
from tests.corpus.truth import (
    Prompt,
    Served,
    first_difference,
    prompt_of,
    relation,
    repeated,
    section_at,
    served,
)
from tests.llama import LlamaArtifacts, started_llama_server
from tests.terminal import terminal_log

pytestmark = pytest.mark.real

CORPUS = Path(__file__).parents[1] / "corpus"
SERVER_ARGS = {
    "full": ("-t", "1", "--swa-full", "--cache-ram", "0"),
    "swa": ("-t", "1", "--cache-ram", "0"),
    "swa2": ("-t", "1", "--cache-ram", "0", "-np", "2"),
}
TOLERANCE = 2
"""Lost tokens may differ from the truth by this much (a boundary token either side)."""
LOST_MIN = 16
"""The spec's floor: a cache shortfall below it is the server's margin, not a cause."""
MIN_SHARED = 8
"""The spec's floor: a prompt sharing fewer tokens with every earlier one is cold."""
RECORD_WAIT_S = 60.0
REWRITES = ("system_prompt_changed", "tools_changed", "history_rewritten", "compaction")
SHORTFALLS = (
    "context_shift",
    "slot_evicted",
    "slot_busy",
    "sliding_window",
    "model_reloaded",
    "cache_prompt_off",
)


def _cases() -> list[Any]:
    cases = []
    for path in sorted(CORPUS.glob("*.json")):
        for replay in json.loads(path.read_text())["replays"]:
            cases.append(pytest.param(path, replay["server"], id=f"{path.stem}-{replay['server']}"))
    return cases


class Servers:
    """The module's llama-servers, each started when a case first needs it."""

    def __init__(self, artifacts: LlamaArtifacts, folder: Path, config: pytest.Config) -> None:
        self._artifacts, self._folder, self._config = artifacts, folder, config
        self._stack = ExitStack()
        self._started: dict[str, LlamaServer] = {}

    def get(self, kind: str) -> LlamaServer:
        """The ``kind`` server with its slots empty."""
        if kind not in self._started:
            slots = self._folder / f"{kind}-slots"
            slots.mkdir(parents=True, exist_ok=True)
            self._started[kind] = self._stack.enter_context(
                started_llama_server(
                    self._artifacts,
                    self._folder / kind,
                    (*SERVER_ARGS[kind], "--slot-save-path", str(slots)),
                    log=terminal_log(self._config, f"llama-server {kind}"),
                )
            )
        server = self._started[kind]
        args = SERVER_ARGS[kind]
        for slot in range(int(args[args.index("-np") + 1]) if "-np" in args else 1):
            request = urllib.request.Request(
                f"{server.url}/slots/{slot}?action=erase", data=b"", method="POST"
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert json.loads(response.read())["id_slot"] == slot
        return server

    def close(self) -> None:
        """Stop every server started."""
        self._stack.close()


@pytest.fixture(scope="module")
def servers(
    llama_artifacts: LlamaArtifacts,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Servers]:
    """The servers the corpus is replayed on, started on demand."""
    started = Servers(llama_artifacts, tmp_path_factory.mktemp("corpus"), request.config)
    try:
        yield started
    finally:
        started.close()


# -- the replay -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One replayed request: as recorded, llama-server's answer, the proxy's record."""

    index: int
    request: dict[str, Any]
    raw: bytes
    record: dict[str, Any] | None
    """None for a request sent straight to llama-server."""


def _send(base: str, entry: dict[str, Any]) -> tuple[bytes, str | None]:
    request = urllib.request.Request(
        base + entry["path"],
        data=entry["body"].encode(),
        headers=entry["headers"],
        method=entry["method"],
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return response.read(), response.headers.get(REQUEST_ID_HEADER)


def _replay(requests: list[dict[str, Any]], llama: str, folder: Path) -> list[Exchange]:
    """Every request in order, each record awaited before the next request."""
    out = []
    with proxy_in_front_of(llama, folder) as proxy:
        for i, entry in enumerate(requests):
            if entry["via"] == "direct":
                raw, _ = _send(llama, entry)
                out.append(Exchange(i, entry, raw, None))
                continue
            raw, request_id = _send(proxy.url, entry)
            assert request_id is not None
            out.append(Exchange(i, entry, raw, proxy.record(request_id, within=RECORD_WAIT_S)))
    return out


# -- the truth --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Truth:
    """What the spec concludes of one request, from llama-server's own figures."""

    reusable: int
    shortfall: int
    prefill_lost: int
    cache_lost: int


class Checker:
    """Compares the records of one replay with the expectations and the truth."""

    def __init__(self, name: str, llama: str, exchanges: list[Exchange]) -> None:
        self.name, self.llama, self.exchanges = name, llama, exchanges
        self.failures: list[str] = []
        self.prompts: dict[int, Prompt] = {}
        self.served: dict[int, Served] = {ex.index: served(ex.raw) for ex in exchanges}

    def fail(self, index: int, what: str, expected: Any, got: Any) -> None:
        self.failures.append(
            f"{self.name} request {index}: {what}: expected {expected!r}, got {got!r}"
        )

    def prompt(self, index: int) -> Prompt:
        if index not in self.prompts:
            entry = self.exchanges[index].request
            self.prompts[index] = prompt_of(self.llama, entry["path"], json.loads(entry["body"]))
        return self.prompts[index]

    def truth(self, index: int, expect: dict[str, Any]) -> Truth | None:
        """The spec's figures for request ``index``, after checking that the expectation
        fits the prompts and this run's counts (a misfit is a corpus failure)."""
        p, s = self.prompt(index), self.served[index]
        if len(p.tokens) != s.prompt_tokens:
            self.fail(
                index,
                "corpus: rendered prompt tokens vs llama-server's",
                s.prompt_tokens,
                len(p.tokens),
            )
            return None
        if expect["matched"] is None:
            self._check_cold(index, p)
            return Truth(0, 0, 0, 0)
        e = self.prompt(expect["matched"])
        d = first_difference(p.tokens, e.tokens)
        kind = expect["prefix_kind"].replace("compaction", "rewrite")
        if relation(p, e) != kind:
            self.fail(index, "corpus: relation by position", kind, relation(p, e))
        section = expect["diverged_section"]
        if section and kind in ("rewrite", "branch") and section_at(p, d) != section:
            self.fail(index, "corpus: section at d", expect["diverged_section"], section_at(p, d))
        reusable = min(d, len(p.tokens) - 1)
        shortfall = max(0, reusable - s.cache_n)
        self._check_measured(index, expect, reusable, shortfall, s)
        cause = expect["prefill_cause"]
        lost = 0
        if cause in REWRITES:
            lost = repeated(e, p, d)
        elif cause == "template_drops_history":
            lost = self.served[expect["matched"]].predicted_n
        elif cause in SHORTFALLS:
            lost = shortfall
        lost = min(lost, s.prompt_n)
        cache = min(shortfall, s.prompt_n - lost) if expect["cache_lost_cause"] else 0
        return Truth(reusable, shortfall, lost, cache)

    def _check_cold(self, index: int, p: Prompt) -> None:
        """A cold prompt shares fewer than 8 tokens, or no complete section, with each
        earlier prompt the proxy saw."""
        first = section_at(p, p.bos)
        for ex in self.exchanges[:index]:
            if ex.record is None:
                continue
            d = first_difference(p.tokens, self.prompt(ex.index).tokens)
            if d >= MIN_SHARED and section_at(p, d) != first:
                self.fail(
                    index,
                    f"corpus: cold, but shares with request {ex.index}",
                    first,
                    section_at(p, d),
                )

    def _check_measured(
        self, index: int, expect: dict[str, Any], reusable: int, shortfall: int, s: Served
    ) -> None:
        """The causes that rest on this run's cache_n: a shortfall cause needs 16 tokens
        short, none may be missing one; an unknown predecessor of a rewrite needs cache_n
        above the shared prefix."""
        named = expect["prefill_cause"] in SHORTFALLS or expect["cache_lost_cause"] is not None
        silent = expect["prefill_cause"] is None and expect["attribution_error"] is None
        if named and shortfall < LOST_MIN:
            self.fail(
                index, "corpus: a cache cause, but the shortfall", f">= {LOST_MIN}", shortfall
            )
        if silent and shortfall >= LOST_MIN and expect["prefix_kind"] != "cold":
            self.fail(index, "corpus: no cause, but the shortfall", f"< {LOST_MIN}", shortfall)
        unknown = expect["attribution_error"] == "predecessor_unknown"
        if unknown and expect["prefix_kind"] in ("rewrite", "compaction") and s.cache_n <= reusable:
            self.fail(index, "corpus: predecessor unknown, but cache_n", f"> {reusable}", s.cache_n)

    def rate(self, index: int) -> float | None:
        """The ms per token the proxy prices request ``index``'s losses at: the latest
        earlier record that prefilled at least ``REFERENCE_MIN_TOKENS``, else its own."""
        records = [ex.record for ex in self.exchanges[:index] if ex.record is not None]
        for r in reversed(records):
            if (r["prompt_n"] or 0) >= REFERENCE_MIN_TOKENS and r["prefill_ms"]:
                return float(r["prefill_ms"]) / float(r["prompt_n"])
        own = self.exchanges[index].record or {}
        if own.get("prefill_ms") and own.get("prompt_n"):
            return float(own["prefill_ms"]) / float(own["prompt_n"])
        return None

    def tokens_of(self, index: int, ms: float | None) -> int | None:
        if not ms:
            return 0
        rate = self.rate(index)
        return round(ms / rate) if rate else None

    def check(self, ex: Exchange, expect: dict[str, Any]) -> None:
        """Every expected field of one record, and its losses against the truth."""
        record = ex.record
        assert record is not None
        fields = (
            "prefix_kind",
            "prefill_cause",
            "cache_lost_cause",
            "diverged_section",
            "attribution_error",
        )
        for field in fields:
            if record.get(field) != expect[field]:
                self.fail(ex.index, field, expect[field], record.get(field))
        truth = self.truth(ex.index, expect)
        if truth is None:
            return
        s = self.served[ex.index]
        print(  # the run's figures, shown with -s or beside a failure
            f"{self.name} #{ex.index}: {record.get('prefix_kind')} "
            f"cause={record.get('prefill_cause')} cache_cause={record.get('cache_lost_cause')} "
            f"| truth: prompt={s.prompt_tokens} cache_n={s.cache_n} prompt_n={s.prompt_n} "
            f"reusable={truth.reusable} shortfall={truth.shortfall} "
            f"lost={truth.prefill_lost}+{truth.cache_lost} "
            f"| record lost={self.tokens_of(ex.index, record.get('prefill_lost_ms'))}"
            f"+{self.tokens_of(ex.index, record.get('cache_lost_ms'))}"
        )
        if record.get("reusable_tokens") != truth.reusable:
            self.fail(ex.index, "reusable_tokens", truth.reusable, record.get("reusable_tokens"))
        for what, want, ms in (
            ("prefill lost tokens", truth.prefill_lost, record.get("prefill_lost_ms")),
            ("cache lost tokens", truth.cache_lost, record.get("cache_lost_ms")),
        ):
            got = self.tokens_of(ex.index, ms)
            if got is None or abs(got - want) > TOLERANCE:
                self.fail(ex.index, f"{what} (+-{TOLERANCE})", want, got)

    def check_conversations(self, expects: list[Any]) -> None:
        """Requests the scenario names one conversation are one of the proxy's, with the
        expected turns; two names are two conversations."""
        names: dict[str, str] = {}
        for ex, expect in zip(self.exchanges, expects, strict=True):
            if expect is None or expect["conversation"] is None or ex.record is None:
                continue
            got = str(ex.record.get("conversation"))
            if names.setdefault(expect["conversation"], got) != got:
                self.fail(ex.index, "conversation", names[expect["conversation"]], got)
            if ex.record.get("turn") != expect["turn"]:
                self.fail(ex.index, "turn", expect["turn"], ex.record.get("turn"))
        if len(set(names.values())) != len(names):
            self.failures.append(f"{self.name}: two conversations in one: {names}")


@pytest.mark.parametrize(("path", "server"), _cases())
def test_corpus_replay(path: Path, server: str, servers: Servers, tmp_path: Path) -> None:
    """Each recorded scenario, replayed through a fresh proxy on its server, gives for
    every request the expected kind, causes, section, error, conversation and turn, the
    spec's reusable prefix, and lost tokens within 2 of the truth computed from
    llama-server alone."""
    document = json.loads(path.read_text())
    expects = next(r["expect"] for r in document["replays"] if r["server"] == server)
    llama = servers.get(server)
    exchanges = _replay(document["requests"], llama.url, tmp_path / "proxy")
    checker = Checker(f"{path.stem} on {server}", llama.url, exchanges)
    for ex, expect in zip(exchanges, expects, strict=True):
        if expect is not None:
            checker.check(ex, expect)
    checker.check_conversations(expects)
    assert not checker.failures, "\n".join(checker.failures)
