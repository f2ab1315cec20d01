"""The live dashboard in a real browser: Debian's Chromium driven by Playwright.

Needs the ``chromium`` Debian package (``/usr/bin/chromium``) and the ``playwright`` pip
package; ``playwright install`` is never run (it downloads a browser). When either is missing
the tests fail if ``CI`` is set and are skipped otherwise, with the reason. The screenshot of
the first test goes to ``$TIMING_PROXY_ARTIFACTS/dashboard.png`` (default ``artifacts/``).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NoReturn

import orjson
import pytest
from aiohttp.test_utils import TestServer

from proxy.core.record import Kind, Outcome, Record
from proxy.core.stats import Stats
from proxy.serve.app import STATS
from tests.conftest import ProxyFactory, ProxyUnderTest
from tests.fakes import FakeUpstream, load_recording, replay
from tests.terminal import terminal_log

try:
    from playwright.async_api import (  # type: ignore[import-not-found,unused-ignore]
        Browser,
        Page,
        Route,
        async_playwright,
    )
except ImportError as exc:  # reported by the ``browser`` fixture
    PLAYWRIGHT_MISSING: str | None = f"the playwright pip package is not installed ({exc})"
else:
    PLAYWRIGHT_MISSING = None

CHROMIUM = os.environ.get("TIMING_PROXY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
ROW = ".row[data-id]"


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> NoReturn:
    if _ci():
        pytest.fail(
            f"{reason} (CI installs them: apt-get install chromium; pip install playwright)",
            pytrace=False,
        )
    pytest.skip(reason)


def _chromium_present() -> bool:
    return Path(CHROMIUM).is_file() or shutil.which(CHROMIUM) is not None


def _artifacts() -> Path:
    path = Path(os.environ.get("TIMING_PROXY_ARTIFACTS", "artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """A headless Debian Chromium (never a downloaded one)."""
    if PLAYWRIGHT_MISSING is not None:
        _unavailable(PLAYWRIGHT_MISSING)
    if not _chromium_present():
        _unavailable(f"no Chromium at {CHROMIUM} (Debian package: chromium)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


async def _new_page(browser: Browser) -> Page:
    page: Page = await browser.new_page(viewport={"width": 1440, "height": 1000})
    return page


def _watch(page: Page) -> list[str]:
    """Collect the page's console errors and uncaught exceptions."""
    errors: list[str] = []

    def on_console(msg: Any) -> None:
        if msg.type == "error":
            errors.append(f"console.error: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    return errors


def _url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


async def _wait_records(proxy: ProxyUnderTest, count: int, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while len(proxy.captured.records) < count:
        assert time.monotonic() < deadline, (
            f"the proxy wrote {len(proxy.captured.records)} records, wanted {count}"
        )
        await asyncio.sleep(0.01)


async def _send(
    upstream: FakeUpstream, proxy: ProxyUnderTest, name: str, speed: float = 0.0
) -> str:
    """Replay recording ``name`` through the proxy; the id of the record it made."""
    rec = load_recording(name)
    upstream.script = replay(rec, speed=speed)
    before = len(proxy.captured.records)
    resp = await proxy.client.request(
        rec.request_method,
        rec.request_path,
        data=rec.request_body,
        headers={"Content-Type": "application/json"},
    )
    await resp.read()
    await _wait_records(proxy, before + 1)
    return proxy.captured.records[-1].id


async def _row_ids(page: Page) -> list[str]:
    ids: list[str] = await page.eval_on_selector_all(
        ROW, "rows => rows.map(r => r.getAttribute('data-id'))"
    )
    return ids


async def _count(page: Page, kind: str) -> str:
    text = await page.text_content(f'.kindcard[data-kind="{kind}"] [data-field="count"]')
    return (text or "").strip()


# ------------------------------------------------------------------------------------------


async def test_dashboard_shows_each_request_clock(
    fake: tuple[FakeUpstream, TestServer],
    make_proxy: ProxyFactory,
    browser: Browser,
    request: pytest.FixtureRequest,
) -> None:
    """Real requests through the proxy, then the page: one clock per request, the summary."""
    upstream, server = fake
    proxy = await make_proxy(_url(server))
    ids: dict[str, str] = {}
    # speed=1 keeps the recorded arrival times, so wall clocks and server clocks agree
    for name in ("chat_stream", "tool_stream", "tool_nostream", "error_context"):
        ids[name] = await _send(upstream, proxy, name, speed=1.0)
    records = {r.id: r for r in proxy.captured.records}

    page = await _new_page(browser)
    errors = _watch(page)
    resp = await page.goto(proxy.url + "/dashboard")
    assert resp is not None and resp.status == 200
    for rid in ids.values():
        await page.wait_for_selector(f'.row[data-id="{rid}"]', timeout=5000)

    # the rows are exactly the requests made here, newest first
    assert await _row_ids(page) == list(reversed(ids.values()))

    chat = page.locator(f'.row[data-id="{ids["chat_stream"]}"]')
    tool = page.locator(f'.row[data-id="{ids["tool_stream"]}"]')
    assert await chat.locator(".seg.prefill").count() == 1
    assert await chat.locator(".tool-marker").count() == 0
    chat_ticks = records[ids["chat_stream"]].predicted_n
    assert await chat.locator(f'.ticks[data-ticks="{chat_ticks}"]').count() == 1
    # the tool row: prefill, decode ticks, and the tool call marked as valid
    assert await tool.locator(".seg.prefill").count() == 1
    assert await tool.locator(".tool-marker.valid").count() == 1
    assert await tool.locator(".seg.decode").count() == 1
    nostream = page.locator(f'.row[data-id="{ids["tool_nostream"]}"]')
    assert "non-stream" in (await nostream.text_content() or "")
    assert await nostream.locator(".tool-marker").count() == 1
    failed = page.locator(f'.row[data-id="{ids["error_context"]}"]')
    assert "400" in (await failed.text_content() or "")
    assert await failed.evaluate("r => r.classList.contains('err')")

    # the summary counts each kind
    kinds = [str(r.kind) for r in proxy.captured.records]
    assert await _count(page, "chat") == str(kinds.count(str(Kind.CHAT)))
    assert await _count(page, "tool") == str(kinds.count(str(Kind.TOOL)))
    assert await page.locator('.kindcard[data-kind="chat"] [data-field="split"]').count() == 1

    # the record of a row opens on click
    await tool.click()
    await page.wait_for_selector("#detail .kv")
    assert ids["tool_stream"] in (await page.text_content("#detail") or "")

    path = _artifacts() / "dashboard.png"
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    terminal_log(request.config, "dashboard")(f"dashboard screenshot: {path.resolve()}")
    assert errors == []


async def test_dashboard_updates_live_and_pauses(
    fake: tuple[FakeUpstream, TestServer], make_proxy: ProxyFactory, browser: Browser
) -> None:
    """A request made after the page loaded appears without a reload; hidden or paused, the
    page does not poll."""
    upstream, server = fake
    proxy = await make_proxy(_url(server))
    first = await _send(upstream, proxy, "chat_stream")

    page = await _new_page(browser)
    errors = _watch(page)
    await page.goto(proxy.url + "/dashboard")
    await page.wait_for_selector(f'.row[data-id="{first}"]', timeout=5000)
    await page.evaluate("window.__sameDocument = true")
    assert await _count(page, "tool") == "0"

    second = await _send(upstream, proxy, "tool_stream")
    await page.wait_for_selector(f'.row[data-id="{second}"]', timeout=5000)
    assert await _row_ids(page) == [second, first]
    assert await page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    await page.wait_for_function(
        """() => document.querySelector('.kindcard[data-kind="tool"] [data-field="count"]')
                 ?.textContent.trim() === '1'""",
        timeout=5000,
    )

    # a hidden tab does not poll; visible again, it polls at once
    await page.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    await asyncio.sleep(0.3)
    polls = await page.evaluate("window.timingProxyDashboard.polls")
    await asyncio.sleep(1.6)  # more than a poll interval
    assert await page.evaluate("window.timingProxyDashboard.polls") == polls
    await page.evaluate("""() => {
        Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});
        document.dispatchEvent(new Event('visibilitychange'));
    }""")
    await page.wait_for_function(f"() => window.timingProxyDashboard.polls > {polls}", timeout=3000)

    # paused: no new rows; resumed: they come
    await page.click("#pause")
    assert await page.get_attribute("#pause", "aria-pressed") == "true"
    await asyncio.sleep(0.3)  # let a poll already in flight land
    third = await _send(upstream, proxy, "chat_stream")
    await asyncio.sleep(1.6)
    assert third not in await _row_ids(page)
    await page.click("#pause")
    await page.wait_for_selector(f'.row[data-id="{third}"]', timeout=5000)
    assert errors == []


# ------------------------------------------------------------------------------------------
# Synthetic /stats documents, served with page.route


def _synthetic_records(n: int, seed: int = 7) -> list[Record]:
    rnd = random.Random(seed)
    out: list[Record] = []
    for i in range(n):
        kind = Kind.TOOL if rnd.random() < 0.45 else Kind.CHAT
        stream = rnd.random() < 0.8
        rid = f"{i:016x}"
        ts = f"2026-11-30T04:{(i // 60) % 60:02d}:{i % 60:02d}.000Z"
        if rnd.random() < 0.03:
            out.append(
                Record(
                    id=rid,
                    ts=ts,
                    method="POST",
                    path="/v1/chat/completions",
                    model="gemma",
                    stream=stream,
                    kind=kind,
                    status=502,
                    outcome=Outcome.UPSTREAM_UNREACHABLE,
                    e2e_ms=0.8,
                    error="upstream unreachable: ServerDisconnectedError",
                )
            )
            continue
        prompt = rnd.randint(300, 900) if kind is Kind.TOOL else rnd.randint(20, 400)
        cache = rnd.randint(0, prompt - 5)
        prefill = (prompt - cache) * rnd.uniform(3.0, 5.0)
        predicted = rnd.randint(12, 60) if kind is Kind.TOOL else rnd.randint(10, 300)
        rate = rnd.uniform(5.0, 8.0) if kind is Kind.TOOL else rnd.uniform(9.0, 12.0)
        decode = (predicted - 1) / rate * 1000.0
        queue = rnd.uniform(2.0, 40.0)
        ttfb = queue + prefill
        ttft = ttfb + (decode * 0.6 if kind is Kind.TOOL else 0.0)
        e2e = ttfb + decode + rnd.uniform(0.2, 3.0)
        schema_ms = prefill * 0.7 if kind is Kind.TOOL and cache < 200 else 0.0
        out.append(
            Record(
                id=rid,
                ts=ts,
                method="POST",
                path="/v1/chat/completions",
                model="gemma-3-270m-q4_k_m.gguf",
                stream=stream,
                kind=kind,
                status=200,
                ttfb_ms=ttfb if stream else e2e,
                ttft_ms=ttft if stream else None,
                e2e_ms=e2e,
                decode_wall_ms=e2e - ttft if stream else None,
                prefill_ms=prefill,
                decode_ms=decode,
                prompt_n=prompt - cache,
                cache_n=cache,
                predicted_n=predicted,
                prompt_tokens=prompt,
                cache_hit_ratio=cache / prompt,
                decode_tok_s=rate,
                overhead_ms=ttft - prefill if stream else None,
                tool_calls=1 if kind is Kind.TOOL else 0,
                tool_call_valid=(rnd.random() > 0.1) if kind is Kind.TOOL else None,
                tool_call_ms=e2e - 1.0 if kind is Kind.TOOL else None,
                schema_hash="6a98445ed550" if kind is Kind.TOOL else None,
                schema_prefill_ms=schema_ms if kind is Kind.TOOL else None,
                finish_reason="tool_calls" if kind is Kind.TOOL else "stop",
            )
        )
    return out


def _stats_doc(records: list[Record], schemas: dict[str, Any] | None = None) -> bytes:
    stats = Stats(since="2026-11-30T04:00:00.000Z", recent=len(records))
    for r in records:
        stats.add(r)
    doc = stats.snapshot()
    doc["schemas"] = schemas
    return orjson.dumps(doc)


SCHEMAS = {
    "prefilled_again": 3,
    "by_hash": {
        "6a98445ed550": {
            "tokens": 265,
            "tools": 2,
            "source": "server",
            "calls": 2000,
            "cached": 1500,
            "paid_ms": 91234.5,
            "saved_ms": 301000.25,
            "prefilled_again": 3,
            "per_tool_tokens": {"get_weather": 118, "move_arm": 131},
        },
        "0123456789ab": {
            "tokens": 40,
            "tools": 1,
            "source": "estimate",
            "calls": 3,
            "cached": 0,
            "paid_ms": 120.0,
            "saved_ms": 0.0,
            "prefilled_again": 0,
            "per_tool_tokens": None,
        },
    },
}


def _serve(
    body: bytes,
    check: Callable[[Route], bool] | None = None,
) -> Callable[[Route], Any]:
    async def handler(route: Route) -> None:
        if check is not None and not check(route):
            await route.fulfill(
                status=401, content_type="application/json", body=b'{"error":"unauthorized"}'
            )
            return
        await route.fulfill(status=200, content_type="application/json", body=body)

    return handler


async def test_dashboard_stays_small_with_5000_records(
    make_proxy: ProxyFactory, browser: Browser
) -> None:
    """5,000 recent records in the proxy's own /stats: fast, only visible rows in the DOM."""
    records = _synthetic_records(5000)
    hostile = '<img src=x onerror="window.__xss=1">'
    records[-1] = Record(
        **{
            **records[-1].to_dict(),
            "kind": Kind.CHAT,
            "outcome": Outcome.COMPLETED,
            "model": hostile,
        }
    )
    proxy = await make_proxy("http://127.0.0.1:9", stats={"recent": 5000})
    stats = proxy.app[STATS]
    for r in records:
        stats.add(r)
    page = await _new_page(browser)
    errors = _watch(page)

    t0 = time.perf_counter()
    await page.goto(proxy.url + "/dashboard")
    await page.wait_for_selector(f'.row[data-id="{records[-1].id}"]', timeout=10_000)
    elapsed = time.perf_counter() - t0
    diag = await page.evaluate("window.timingProxyDashboard")
    # in the page: navigation start to the first document on screen (fetch, parse, render)
    assert diag["firstDataMs"] < 2000, f"5,000 records on screen after {diag}"
    assert elapsed < 5.0, f"goto to the first row took {elapsed:.2f} s ({diag})"
    assert diag["applyMs"] < 1000, diag
    assert diag["interval"] > 1000, "a 5,000-record /stats should be polled less often"

    rows = await page.locator(ROW).count()
    assert 0 < rows <= 80, f"{rows} row elements for 5,000 records"
    assert await page.evaluate("document.getElementsByTagName('*').length") < 4000
    # the newest record is on top; its hostile model name is text, not markup
    assert (await _row_ids(page))[0] == records[-1].id
    newest = page.locator(f'.row[data-id="{records[-1].id}"]')
    assert hostile in (await newest.text_content() or "")
    assert await page.evaluate("window.__xss === undefined")
    assert await page.locator("#canvas img").count() == 0
    # scrolling to the end renders the oldest record, still with a bounded DOM
    await page.eval_on_selector("#viewport", "v => { v.scrollTop = v.scrollHeight; }")
    await page.wait_for_selector(f'.row[data-id="{records[0].id}"]', timeout=5000)
    assert await page.locator(ROW).count() <= 80
    # filtering and the scale switch
    await page.select_option("#fkind", "tool")
    await page.wait_for_function(
        "() => [...document.querySelectorAll('.row[data-id]')]"
        ".every(r => r.dataset.kind === 'tool')"
    )
    assert 0 < await page.locator(ROW).count() <= 80
    await page.select_option("#scale", "fit")
    assert await page.locator(".row .tool-marker").count() > 0
    assert await page.locator(".row .tool-marker.invalid").count() > 0
    assert await _count(page, "tool") == f"{sum(r.kind is Kind.TOOL for r in records):,}"
    await page.wait_for_timeout(1500)  # polls of the 5,000 records go on without errors
    assert errors == []


async def test_dashboard_schema_table(make_proxy: ProxyFactory, browser: Browser) -> None:
    """The schemas section: one row per hash, "prefilled again" highlighted, text escaped."""
    records = _synthetic_records(20)
    schemas = orjson.loads(orjson.dumps(SCHEMAS))
    schemas["by_hash"]["0123456789ab"]["per_tool_tokens"] = {"<b>bold</b>": 40}
    proxy = await make_proxy("http://127.0.0.1:9")
    page = await _new_page(browser)
    errors = _watch(page)
    await page.route("**/stats", _serve(_stats_doc(records, schemas)))
    await page.goto(proxy.url + "/dashboard")
    await page.wait_for_selector('#schemabody tr[data-hash="6a98445ed550"]', timeout=5000)
    again = page.locator('#schemabody tr[data-hash="6a98445ed550"]')
    assert await again.evaluate("r => r.classList.contains('again')")
    text = await again.text_content() or ""
    assert "get_weather 118" in text and "move_arm 131" in text and "91.2 s" in text
    other = page.locator('#schemabody tr[data-hash="0123456789ab"]')
    assert not await other.evaluate("r => r.classList.contains('again')")
    assert "<b>bold</b> 40" in (await other.text_content() or "")
    assert await page.locator("#schemabody b").count() == 0
    assert "prefilled" in (await page.text_content("#schemabody .hint") or "")
    assert errors == []


async def test_dashboard_asks_for_the_token(make_proxy: ProxyFactory, browser: Browser) -> None:
    """/stats answering 401: a token prompt; the token goes out as a Bearer header."""
    records = _synthetic_records(3)
    body = _stats_doc(records)
    proxy = await make_proxy("http://127.0.0.1:9")
    seen: list[str | None] = []

    def authorised(route: Route) -> bool:
        auth = route.request.headers.get("authorization")
        seen.append(auth)
        return auth == "Bearer s3cret"

    page = await _new_page(browser)
    errors = _watch(page)
    await page.route("**/stats", _serve(body, authorised))
    await page.goto(proxy.url + "/dashboard")
    await page.wait_for_selector("#auth:not([hidden])", timeout=5000)
    assert await page.locator(ROW).count() == 0
    await page.fill("#tokeninput", "s3cret")
    await page.click("#authform button")
    await page.wait_for_selector(f'.row[data-id="{records[-1].id}"]', timeout=5000)
    assert await page.is_hidden("#auth")
    assert seen[0] is None and seen[-1] == "Bearer s3cret"

    # ?token= in the address works without the prompt
    page2 = await _new_page(browser)
    errors2 = _watch(page2)
    await page2.route("**/stats", _serve(body, authorised))
    await page2.goto(proxy.url + "/dashboard?token=s3cret")
    await page2.wait_for_selector(f'.row[data-id="{records[-1].id}"]', timeout=5000)
    assert await page2.is_hidden("#auth")
    # the browser console logs the 401 response itself; the page adds no error of its own
    assert [e for e in errors + errors2 if "401" not in e] == []
