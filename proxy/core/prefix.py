"""A prompt as the served llama-server renders and tokenizes it, and the parts of the request
it holds. Pure: the renderings come from :mod:`proxy.serve.attribution`.

A prompt is known by ``/apply-template``, then ``/tokenize`` with pieces: its token ids and,
for each token, where its text starts. The request body names the *sections* (each message's
content, reasoning and tool calls, each tool); each is found in the rendered text in order,
and a section ends where its own text ends, so the template's markup before a message belongs
to that message. What follows the last section is the generation prompt.

The *last turn* is what the agent adds to ask its next question: the messages after the last
assistant or tool message (with none, the messages after the system ones), and the generation
prompt. A change there is a new question, not a change of the history; the system messages and
the tools are never part of it. How prompts relate to each other is
:mod:`proxy.core.lineage`.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "GENERATION",
    "SYSTEM_ROLES",
    "RenderedPrompt",
    "Section",
    "locate_sections",
    "message_index",
    "shared_prefix",
    "shared_suffix",
]

GENERATION = "generation_prompt"
"""The section after the last one the body names: the template's assistant header."""

SYSTEM_ROLES = frozenset({"system", "developer"})
"""Roles of the instructions before the conversation."""

_ANSWER_ROLES = frozenset({"assistant", "tool", "function"})
"""Roles after which the agent's next question starts."""

_MESSAGE = re.compile(r"messages\[(\d+)\]")


def message_index(section: str) -> int | None:
    """The message a section name belongs to (``messages[3].content`` is 3), else None."""
    match = _MESSAGE.match(section)
    return int(match.group(1)) if match else None


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
    """How many leading items of width ``width`` bytes ``a`` and ``b`` share. The bound
    grows from a few items first, so an unrelated pair costs a few short comparisons."""
    lo, most = 0, min(len(a), len(b)) // width
    hi = min(8, most)
    while hi < most and a[: hi * width] == b[: hi * width]:
        lo, hi = hi, min(hi * 8, most)
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
    starts: array[int]
    """The character where each token's text starts (``array('I')``: 4 bytes a token)."""
    sections: tuple[Section, ...]
    missing: tuple[str, ...] = ()
    text: str | None = None
    """The rendered text, kept only when diffs may be shown (``[privacy] show_diff_text``)."""
    roles: tuple[str, ...] = ()
    """Each message's role, in the body's order."""
    messages: tuple[str, ...] = ()
    """A digest of each message (role, content, reasoning, calls): which ones two prompts
    share, wherever they sit."""
    last_turn: int = 0
    """The first message of the last turn (``len(roles)`` when it holds none)."""
    content: bytes = b""
    """One byte per token: 1 where the token starts in a section's own text (a message's
    content, a tool's JSON), 0 in the template's markup."""

    @staticmethod
    def build(
        ids: Iterable[int],
        pieces: Sequence[bytes],
        text: str,
        chat_body: dict[str, Any],
        keep_text: bool = False,
    ) -> RenderedPrompt:
        """From ``/tokenize``'s ids and byte pieces of ``text``."""
        starts = array("I")
        at = 0
        char_of = _char_offsets(text.encode())
        for piece in pieces:
            starts.append(char_of(at))
            at += len(piece)
        sections, missing = locate_sections(text, chat_body)
        raw = chat_body.get("messages")
        messages = [m if isinstance(m, dict) else {} for m in raw] if isinstance(raw, list) else []
        roles = tuple(str(m.get("role", "")) for m in messages)
        return RenderedPrompt(
            tokens=array("I", ids).tobytes(),
            starts=starts,
            sections=tuple(sections),
            missing=tuple(missing),
            text=text if keep_text else None,
            roles=roles,
            messages=tuple(_message_digest(m) for m in messages),
            last_turn=_last_turn(roles),
            content=_content_mask(starts, sections),
        )

    def __len__(self) -> int:
        return len(self.tokens) // 4

    @property
    def nbytes(self) -> int:
        """About what this prompt holds in memory."""
        text = len(self.text) if self.text is not None else 0
        tokens = len(self.tokens) + 4 * len(self.starts) + len(self.content)
        return tokens + text + 64 * len(self.sections) + 256

    def section_at(self, token: int) -> tuple[str, int]:
        """The section holding token ``token`` (no BOS counted), and the character offset of
        that token in the section's own text (0 when it is in the markup before it)."""
        char = self._char(token)
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

    def in_last_turn(self, section: str) -> bool:
        """Whether ``section`` is part of the last turn (the generation prompt is)."""
        if section == GENERATION:
            return True
        index = message_index(section)
        return index is not None and index >= self.last_turn

    def role_of(self, section: str) -> str | None:
        """The role of the message ``section`` belongs to (None: a tool, the generation)."""
        index = message_index(section)
        return self.roles[index] if index is not None and index < len(self.roles) else None

    def text_tokens(self, name: str) -> tuple[int, int]:
        """The tokens ``[start, end)`` that start in the own text of section ``name`` (an
        empty range when it has none)."""
        section = next((s for s in self.sections if s.name == name), None)
        if section is None:
            return 0, 0
        start = bisect.bisect_left(self.starts, section.end - section.length)
        return start, bisect.bisect_left(self.starts, section.end)

    def has_history(self) -> bool:
        """Whether messages other than the system ones come before the last turn."""
        return any(role not in SYSTEM_ROLES for role in self.roles[: self.last_turn])

    def completes_a_section(self, token: int) -> bool:
        """Whether some section's text ends before token ``token``: a prefix up to there
        holds more than the template's markup and the start of a first message."""
        return bool(self.sections) and self.sections[0].end <= self._char(token)

    def _char(self, token: int) -> int:
        return self.starts[token] if token < len(self.starts) else self._length()

    def _length(self) -> int:
        return self.starts[-1] + 1 if self.starts else 0

    def digest(self) -> str:
        """A short name of the token sequence."""
        return hashlib.sha256(self.tokens).hexdigest()[:12]


def _content_mask(starts: Sequence[int], sections: Sequence[Section]) -> bytes:
    """1 for each token starting inside a section's own text, else 0."""
    spans = sorted((s.end - s.length, s.end) for s in sections if s.length)
    mask = bytearray(len(starts))
    i = 0
    for token, char in enumerate(starts):
        while i < len(spans) and spans[i][1] <= char:
            i += 1
        if i < len(spans) and spans[i][0] <= char:
            mask[token] = 1
    return bytes(mask)


def _message_digest(message: dict[str, Any]) -> str:
    kept = {k: message.get(k) for k in ("role", "content", "reasoning_content", "tool_calls")}
    data = orjson.dumps(kept, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _last_turn(roles: Sequence[str]) -> int:
    """The first message of the last turn: after the last answer, else after the system
    messages (``len(roles)`` when the prompt ends with an answer)."""
    answered = [i for i, role in enumerate(roles) if role in _ANSWER_ROLES]
    if answered:
        return answered[-1] + 1
    return next((i for i, role in enumerate(roles) if role not in SYSTEM_ROLES), len(roles))


def _char_offsets(data: bytes) -> Any:
    """A function from a byte offset of UTF-8 ``data`` to the character offset there."""
    if data.isascii():
        return lambda at: at
    boundaries = [i for i, b in enumerate(data) if b & 0xC0 != 0x80]
    # a byte inside a character (a piece that splits it) belongs to that character
    return lambda at: bisect.bisect_right(boundaries, at) - 1
