"""Tests for proxy.serve.rivals: which requests held a slot beside one when its prefill began
(its end less llama-server's prefill and decode times), with their rendered prompts."""

from __future__ import annotations

import asyncio

from proxy.core.lineage import Rival
from proxy.core.prefix import RenderedPrompt
from proxy.core.record import Record
from proxy.serve.rivals import Rivals
from tests.qwen3_toy import TOOLS, chat, rendered, system, user


def _record(prefill_ms: float | None, decode_ms: float | None = 0.0) -> Record:
    return Record(
        id="r", ts=None, method="POST", path="/", prefill_ms=prefill_ms, decode_ms=decode_ms
    )


def _prompt(question: str) -> RenderedPrompt:
    return rendered(chat(system("You control a robot arm."), user(question), tools=TOOLS))


def _done(prompt: RenderedPrompt) -> asyncio.Future[RenderedPrompt]:
    future: asyncio.Future[RenderedPrompt] = asyncio.get_running_loop().create_future()
    future.set_result(prompt)
    return future


async def test_the_request_running_when_the_prefill_began() -> None:
    """A request sent before this one's prefill began (2.0 s: it ended at 3.0 after 1,000
    ms of prefill and decode) and ending after it is beside it, with its number once
    attributed; one that ended before, one sent after, and one to another cache are not."""
    rivals = Rivals()
    mine = rivals.opened("", _done(_prompt("Wave.")), 1.0)
    running = _prompt("Go to the dock.")
    beside = rivals.opened("", _done(running), 1.5)
    ended = rivals.opened("", _done(_prompt("Open the door.")), 0.5)
    later = rivals.opened("", _done(_prompt("Sit.")), 2.5)
    other = rivals.opened("other-model", _done(_prompt("Stand.")), 1.5)
    for ticket, end in ((ended, 1.9), (beside, 4.0), (later, 5.0), (other, 4.0), (mine, 3.0)):
        rivals.ended(ticket, end)
    assert rivals.beside(mine, _record(600.0, 400.0)) == [Rival(running)]
    rivals.attributed(beside, 7)
    assert rivals.beside(mine, _record(600.0, 400.0)) == [Rival(running, 7)]
    # its prefill began at 2.6 s: the request sent at 2.5 s was running too
    assert len(rivals.beside(mine, _record(300.0, 100.0))) == 2


async def test_nobody_when_unknown_or_unrendered() -> None:
    """No rivals without llama-server's prefill time, before the request ended, without a
    ticket; a request whose prompt is still rendering or failed to render is left out."""
    rivals = Rivals()
    mine = rivals.opened("", _done(_prompt("Wave.")), 1.0)
    pending: asyncio.Future[RenderedPrompt] = asyncio.get_running_loop().create_future()
    failed: asyncio.Future[RenderedPrompt] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("no /tokenize"))
    failed.exception()
    rivals.opened("", pending, 1.0)
    rivals.opened("", failed, 1.0)
    assert rivals.beside(mine, _record(500.0)) == []  # not ended yet
    rivals.ended(mine, 3.0)
    assert rivals.beside(mine, _record(None)) == []
    assert rivals.beside(None, _record(500.0)) == []
    assert rivals.beside(mine, _record(500.0)) == []
    pending.set_result(_prompt("Go."))
    assert rivals.beside(mine, _record(500.0)) == [Rival(pending.result())]


async def test_settled_requests_are_forgotten() -> None:
    """Requests one after another, each settled once attributed: nothing is kept."""
    rivals = Rivals()
    for i in range(10):
        ticket = rivals.opened("", _done(_prompt("Wave.")), float(i))
        rivals.ended(ticket, i + 0.5)
        assert rivals.beside(ticket, _record(100.0)) == []
        rivals.settle(ticket)
    assert len(rivals) == 0
