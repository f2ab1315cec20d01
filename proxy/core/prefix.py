"""Prefix attribution: where a prompt stops matching the prompts before it, in which section,
and why its prefill was paid. Pure: the renderings come from :mod:`proxy.serve.accounting`.

A prompt is known as llama-server renders and tokenizes it (``/apply-template``, then
``/tokenize`` with pieces): its token ids and, for each token, where its text starts. The
request body names the *sections* (each message's content, reasoning and tool calls, each
tool); each is found in the rendered text in order, and a section ends where its own text
ends, so the template's markup before a message belongs to that message. What follows the
last section is the generation prompt.

Each new prompt is compared with a bounded set of recent ones: the best match is one it
extends (the earlier prompt is a prefix of it up to that prompt's generation prompt, which the
next turn renders otherwise), else the one sharing the longest token prefix, the most recent
first. The comparison is of token ids held as bytes, so the shared prefix is found by C-level
slice comparisons in a binary search, not a Python loop over tokens.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Attribution",
    "PrefixKind",
    "PromptHistory",
    "RenderedPrompt",
    "Section",
    "locate_sections",
    "shared_prefix",
    "shared_suffix",
]

GENERATION = "generation_prompt"
"""The section after the last one the body names: the template's assistant header."""

MIN_SHARED = 8
"""A best match sharing fewer tokens than this (a template header) makes a prompt cold."""

EXPLICIT_IDS = 1024
"""Conversation ids sent by agents that are remembered (the least recent is forgotten)."""

PROBE = 16
"""Tokens of the earlier prompt, just after a divergence, looked for in the new prompt: found,
the earlier prompt resumes there, and the new one is a change of it (a clock, a reordered
tool), even on a later turn that also grew."""

RELATED = 0.5
"""A prompt that neither extends nor repeats its best match is a change of that prompt only
when the two share at least this fraction of the new prompt at their two ends (prefix plus
suffix: a clock in the system prompt leaves both); otherwise it is another agent's, cold."""


class PrefixKind(enum.StrEnum):
    """How a prompt relates to the best-matching earlier one."""

    COLD = "cold"
    RETRY = "retry"
    EXTENDS = "extends"
    REWRITE = "rewrite"
    COMPACTION = "compaction"


@dataclass(frozen=True, slots=True)
class Section:
    """A named part of the request whose own text (``length`` characters) ends at character
    ``end`` of the rendered prompt; the markup before that text belongs to it too."""

    name: str
    end: int
    length: int = 0


def _text_of(content: Any) -> str | None:
    """A message content's text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        texts = [p for p in parts if isinstance(p, str) and p]
        return "".join(texts) if texts else None
    return None


def _call_anchor(call: Any) -> str | None:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return None
    args = fn.get("arguments")
    if isinstance(args, str) and args:
        return args
    name = fn.get("name")
    return name if isinstance(name, str) and name else None


def _message_anchors(messages: Sequence[Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        reasoning = m.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            out.append((f"messages[{i}].reasoning_content", reasoning))
        text = _text_of(m.get("content"))
        if text:
            out.append((f"messages[{i}].content", text))
        for j, call in enumerate(m.get("tool_calls") or ()):
            anchor = _call_anchor(call)
            if anchor:
                out.append((f"messages[{i}].tool_calls[{j}]", anchor))
    return out


def _tool_anchors(tools: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for j, tool in enumerate(tools if isinstance(tools, list) else ()):
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            out.append((f"tools[{j}]:{name}", name))
    return out


def locate_sections(text: str, chat_body: dict[str, Any]) -> tuple[list[Section], list[str]]:
    """The body's sections in the rendered ``text`` of its Chat Completions form, ordered,
    and the names of those the rendering does not hold (a template that drops a message's
    reasoning, say). Messages are looked for in order, each after the previous one; a tool
    by its quoted name, its section running to the end of that line (templates write one
    tool per line)."""
    found: list[Section] = []
    missing: list[str] = []
    spans: list[tuple[int, int]] = []  # the tools' lines: no message is looked for there
    tool_cursor = 0
    for name, tool_name in _tool_anchors(chat_body.get("tools")):
        at = _find_tool(text, tool_name, tool_cursor)
        if at < 0:
            missing.append(name)
            continue
        line_start = text.rfind("\n", 0, at) + 1
        line_end = text.find("\n", at)
        tool_cursor = len(text) if line_end < 0 else line_end
        spans.append((line_start, tool_cursor))
        found.append(Section(name, tool_cursor, tool_cursor - line_start))
    cursor = 0
    messages = chat_body.get("messages")
    for name, anchor in _message_anchors(messages if isinstance(messages, list) else []):
        at = text.find(anchor, cursor)
        while at >= 0 and any(a <= at < b for a, b in spans):
            at = text.find(anchor, at + 1)
        if at < 0:
            missing.append(name)
            continue
        cursor = at + len(anchor)
        found.append(Section(name, cursor, len(anchor)))
    found.sort(key=lambda s: s.end)
    return found, missing


def _find_tool(text: str, name: str, start: int) -> int:
    """Where a tool's JSON names it (``"name": "NAME"``), else its quoted name."""
    for pattern in (f'"name": "{name}"', f'"name":"{name}"', f'"{name}"'):
        at = text.find(pattern, start)
        if at >= 0:
            return at
    return -1


def shared_suffix(a: bytes, b: bytes, width: int = 4) -> int:
    """How many trailing items of width ``width`` bytes ``a`` and ``b`` share."""
    lo, hi = 0, min(len(a), len(b)) // width
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid * width :] == b[len(b) - mid * width :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def shared_prefix(a: bytes, b: bytes, width: int = 4) -> int:
    """How many leading items of width ``width`` bytes ``a`` and ``b`` share."""
    lo, hi = 0, min(len(a), len(b)) // width
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: mid * width] == b[: mid * width]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """One prompt as the served template and tokenizer make it (no BOS), with its sections."""

    tokens: bytes
    """Token ids as unsigned 32-bit items (``array('I')``): compared by slices."""
    starts: tuple[int, ...]
    """The character where each token's text starts."""
    sections: tuple[Section, ...]
    missing: tuple[str, ...] = ()
    text: str | None = None
    """The rendered text, kept only when diffs may be shown (``[privacy] show_diff_text``)."""

    @staticmethod
    def build(
        ids: Iterable[int],
        pieces: Sequence[bytes],
        text: str,
        chat_body: dict[str, Any],
        keep_text: bool = False,
    ) -> RenderedPrompt:
        """From ``/tokenize``'s ids and byte pieces of ``text``."""
        starts: list[int] = []
        at = 0
        data = text.encode()
        char_of = _char_offsets(data)
        for piece in pieces:
            starts.append(char_of(at))
            at += len(piece)
        sections, missing = locate_sections(text, chat_body)
        return RenderedPrompt(
            tokens=array("I", ids).tobytes(),
            starts=tuple(starts),
            sections=tuple(sections),
            missing=tuple(missing),
            text=text if keep_text else None,
        )

    def __len__(self) -> int:
        return len(self.tokens) // 4

    def section_at(self, token: int) -> tuple[str, int]:
        """The section holding token ``token`` (no BOS counted), and the character offset of
        that token in the section's own text (0 when it is in the markup before it)."""
        char = self.starts[token] if token < len(self.starts) else self._length()
        ends = [s.end for s in self.sections]
        i = bisect.bisect_right(ends, char)
        if i >= len(self.sections):
            return GENERATION, char - (ends[-1] if ends else 0)
        section = self.sections[i]
        return section.name, max(0, char - (section.end - section.length))

    def generation_start(self) -> int:
        """The first token of the generation prompt (after the last section)."""
        if not self.sections:
            return 0
        return bisect.bisect_left(self.starts, self.sections[-1].end)

    def _length(self) -> int:
        return self.starts[-1] + 1 if self.starts else 0

    def digest(self) -> str:
        """A short name of the token sequence."""
        return hashlib.sha256(self.tokens).hexdigest()[:12]


def _char_offsets(data: bytes) -> Any:
    """A function from a byte offset of UTF-8 ``data`` to the character offset there."""
    if data.isascii():
        return lambda at: at
    boundaries = [i for i, b in enumerate(data) if b & 0xC0 != 0x80]
    # a byte inside a character (a piece that splits it) belongs to that character
    return lambda at: bisect.bisect_right(boundaries, at) - 1


@dataclass(frozen=True, slots=True)
class Attribution:
    """What one prompt shares with the prompts before it, and where it diverged."""

    prefix_kind: PrefixKind
    reusable_tokens: int
    cache_lost_tokens: int | None
    diverged_at: int | None
    diverged_section: str | None
    diverged_offset: int | None
    diverged_cost_ms: float | None
    conversation: str
    turn: int
    matched: int | None = None
    """The sequence number of the earlier prompt matched (for causes that need it)."""
    between: int = 0
    """Prompts seen after the match and before this one (another agent's, say)."""


@dataclass(slots=True)
class _Seen:
    prompt: RenderedPrompt
    seq: int
    conversation: str
    turn: int
    predicted_n: int | None = None
    prompt_tokens: int | None = None


@dataclass(slots=True)
class PromptHistory:
    """The last ``size`` prompts, for matching; conversation numbering."""

    size: int = 64
    _seen: deque[_Seen] = field(default_factory=deque)
    _seq: int = 0
    _conversations: int = 0
    _explicit: dict[str, int] = field(default_factory=dict)

    def attribute(
        self,
        prompt: RenderedPrompt,
        *,
        offset: int,
        cache_n: int | None,
        ms_per_token: float | None,
        conversation_id: str | None = None,
    ) -> Attribution:
        """Match ``prompt`` against the history, then remember it. ``offset`` counts the
        tokens the tokenizer adds before the text (BOS): positions in the record count
        them, as ``cache_n`` does."""
        self._seq += 1
        best, shared, extends = self._best(prompt)
        kind = _kind(prompt, best, shared, extends)
        total = len(prompt) + offset
        # the last prompt token is always evaluated again: it yields the first token's logits
        reusable = min(shared + offset, total - 1) if kind is not PrefixKind.COLD else 0
        lost = max(0, reusable - cache_n) if cache_n is not None else None
        diverged_at = section = char = cost = None
        if kind in (PrefixKind.REWRITE, PrefixKind.COMPACTION):
            diverged_at = shared + offset
            section, char = prompt.section_at(shared)
            if ms_per_token is not None:
                cost = round((total - diverged_at) * ms_per_token, 3)
        conversation, turn = self._conversation(best, kind, conversation_id)
        between = self._seq - 1 - best.seq if best is not None else 0
        self._seen.append(_Seen(prompt, self._seq, conversation, turn))
        while len(self._seen) > self.size:
            self._seen.popleft()
        return Attribution(
            prefix_kind=kind,
            reusable_tokens=reusable,
            cache_lost_tokens=lost,
            diverged_at=diverged_at,
            diverged_section=section,
            diverged_offset=char,
            diverged_cost_ms=cost,
            conversation=conversation,
            turn=turn,
            matched=best.seq if best is not None else None,
            between=between,
        )

    def answered(self, seq: int, predicted_n: int | None, prompt_tokens: int | None = None) -> None:
        """Note how many tokens the answer to prompt ``seq`` generated, after how many."""
        seen = self._seen_at(seq)
        if seen is not None:
            seen.predicted_n = predicted_n
            seen.prompt_tokens = prompt_tokens

    def filled(self, seq: int | None, n_ctx: int | None) -> bool:
        """Whether prompt ``seq`` and its answer reached the context size ``n_ctx``: then
        llama-server shifted the context (or cut the answer), and its cache no longer holds
        that prompt as sent."""
        seen = self._seen_at(seq)
        if n_ctx is None or seen is None or seen.prompt_tokens is None:
            return False
        return seen.prompt_tokens + (seen.predicted_n or 0) >= n_ctx - 1

    def predicted(self, seq: int | None) -> int | None:
        """The generated tokens of prompt ``seq``'s answer, when noted."""
        seen = self._seen_at(seq)
        return seen.predicted_n if seen is not None else None

    def _seen_at(self, seq: int | None) -> _Seen | None:
        """The remembered prompt numbered ``seq`` (None once it left the history)."""
        for seen in reversed(self._seen):
            if seen.seq == seq:
                return seen
        return None

    @property
    def last_seq(self) -> int:
        """The sequence number of the prompt attributed last."""
        return self._seq

    def _best(self, prompt: RenderedPrompt) -> tuple[_Seen | None, int, bool]:
        best: _Seen | None = None
        best_key = (-1, -1, -1)
        best_shared = 0
        for seen in reversed(self._seen):
            shared = shared_prefix(prompt.tokens, seen.prompt.tokens)
            if prompt.tokens == seen.prompt.tokens:
                rank = 2  # a repeat: its own prompt, before any it extends
            elif shared >= seen.prompt.generation_start() and len(prompt) > shared:
                rank = 1
            else:
                rank = 0
            key = (rank, shared, seen.seq)
            if key > best_key:
                best, best_key, best_shared = seen, key, shared
        return best, best_shared, best_key[0] == 1

    def _conversation(
        self, best: _Seen | None, kind: PrefixKind, explicit: str | None
    ) -> tuple[str, int]:
        if explicit is not None:
            turn = self._explicit.pop(explicit, 0) + (0 if kind is PrefixKind.RETRY else 1)
            self._explicit[explicit] = max(turn, 1)
            while len(self._explicit) > EXPLICIT_IDS:
                del self._explicit[next(iter(self._explicit))]
            return explicit, max(turn, 1)
        if best is None or kind is PrefixKind.COLD:
            self._conversations += 1
            return f"c{self._conversations}", 1
        if kind is PrefixKind.RETRY:
            return best.conversation, best.turn
        return best.conversation, best.turn + 1


def _kind(prompt: RenderedPrompt, best: _Seen | None, shared: int, extends: bool) -> PrefixKind:
    if best is None or shared < MIN_SHARED:
        return PrefixKind.COLD
    if prompt.tokens == best.prompt.tokens:
        return PrefixKind.RETRY
    if extends:
        return PrefixKind.EXTENDS
    rest = prompt.tokens[shared * 4 :], best.prompt.tokens[shared * 4 :]
    related = shared + shared_suffix(*rest) >= RELATED * len(prompt)
    if not (related or _resumes(prompt.tokens, best.prompt, shared)):
        return PrefixKind.COLD
    name, _ = prompt.section_at(shared)
    if len(prompt) < len(best.prompt) and name.startswith("messages[") and shared > 0:
        first_user = _first_section_end(best.prompt)
        if shared >= first_user:
            return PrefixKind.COMPACTION
    return PrefixKind.REWRITE


def _resumes(tokens: bytes, earlier: RenderedPrompt, shared: int) -> bool:
    """Whether ``earlier`` continues in ``tokens`` after their divergence at ``shared``: some
    :data:`PROBE` tokens of it that start within :data:`PROBE` tokens of the divergence and
    end before its generation prompt occur, aligned, in ``tokens`` after ``shared``."""
    stop = earlier.generation_start()
    width = 4
    for skip in range(1, PROBE + 1):
        begin = shared + skip
        if begin + PROBE > stop:
            return False
        needle = earlier.tokens[begin * width : (begin + PROBE) * width]
        at = tokens.find(needle, shared * width)
        while at >= 0 and at % width:
            at = tokens.find(needle, at + 1)
        if at >= 0:
            return True
    return False


def _first_section_end(prompt: RenderedPrompt) -> int:
    """The token where the prompt's first section ends."""
    if not prompt.sections:
        return 0
    return bisect.bisect_left(prompt.starts, prompt.sections[0].end)
