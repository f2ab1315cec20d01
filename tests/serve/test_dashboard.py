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
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import orjson
import pytest
import pytest_asyncio
from aiohttp.test_utils import BaseTestServer, TestClient, TestServer

from proxy.core.findings import Cause, Finding
from proxy.core.record import Kind, Outcome, Record
from proxy.core.stats import Stats
from proxy.serve.app import STATS, build_admin_app
from tests.conftest import ProxyFactory, ProxyUnderTest, proxy_app
from tests.fakes import FakeUpstream, load_recording, replay
from tests.terminal import terminal_log

if TYPE_CHECKING:  # imported by the ``browser`` fixture: a run without it never loads it
    from playwright.async_api import (  # type: ignore[import-not-found,unused-ignore]
        Browser,
        Page,
        Route,
    )

CHROMIUM = os.environ.get("TIMING_PROXY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
ROW = ".row[data-id]"

pytestmark = pytest.mark.browser


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


@asynccontextmanager
async def _chromium() -> AsyncIterator[Browser]:
    """A headless Debian Chromium (never a downloaded one)."""
    try:
        from playwright.async_api import (  # type: ignore[import-not-found,unused-ignore]
            async_playwright,
        )
    except ImportError as exc:
        _unavailable(f"the playwright pip package is not installed ({exc})")
    if not _chromium_present():
        _unavailable(f"no Chromium at {CHROMIUM} (Debian package: chromium)")
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """A headless Debian Chromium for one test."""
    async with _chromium() as b:
        yield b


@asynccontextmanager
async def _served_proxy(
    upstream_url: str, **sections: dict[str, object]
) -> AsyncIterator[ProxyUnderTest]:
    """The proxy on a test server, outside the function-scoped ``make_proxy`` fixture (for
    the class-scoped fixtures that share one browser and one proxy between tests)."""
    app, captured, config = proxy_app(upstream_url, **sections)
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    admin: TestClient[Any, Any] = TestClient(TestServer(build_admin_app(app)))
    await client.start_server()
    await admin.start_server()
    try:
        yield ProxyUnderTest(client=client, app=app, captured=captured, config=config, admin=admin)
    finally:
        await admin.close()
        await client.close()


@dataclass
class Shown:
    """A proxy holding records, and the browser that opens its dashboard (one per class)."""

    proxy: ProxyUnderTest
    browser: Browser
    ids: dict[str, str]  # what each record is -> its id, in the order they were made
    shared: Page | None = None

    @property
    def page(self) -> Page:
        """The page opened once for the class, for the tests that only read it."""
        assert self.shared is not None
        return self.shared

    async def open(self) -> tuple[Page, list[str]]:
        """A new page on the dashboard, once the newest record's row is on it; its errors."""
        page = await _new_page(self.browser)
        errors = _watch(page)
        resp = await page.goto(self.proxy.admin_url + "/dashboard")
        assert resp is not None and resp.status == 200
        newest = list(self.ids.values())[-1]
        await page.wait_for_selector(f'.row[data-id="{newest}"]', timeout=10_000)
        return page, errors

    def record(self, name: str) -> Record:
        return next(r for r in self.proxy.captured.records if r.id == self.ids[name])


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


def _url(server: BaseTestServer) -> str:
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
    return _id(proxy.captured.records[-1])


def _id(record: Record) -> str:
    """The id of a record the proxy made (it always has one)."""
    assert record.id is not None
    return record.id


async def _row_ids(page: Page) -> list[str]:
    ids: list[str] = await page.eval_on_selector_all(
        ROW, "rows => rows.map(r => r.getAttribute('data-id'))"
    )
    return ids


async def _count(page: Page, kind: str) -> str:
    text = await page.text_content(f'.kindcard[data-kind="{kind}"] [data-field="count"]')
    return (text or "").strip()


# ------------------------------------------------------------------------------------------


CLOCK_RECORDINGS = ("chat_stream", "tool_stream", "tool_nostream", "error_context")


@pytest.mark.asyncio(loop_scope="class")
class TestRequestClocks:
    """Real requests through the proxy (chat, tool, non-stream tool, upstream error), then
    the dashboard: one clock per request and the summary."""

    @pytest_asyncio.fixture(scope="class", loop_scope="class")
    async def shown(self) -> AsyncIterator[Shown]:
        """The four requests made once through a proxy; one browser for the class."""
        upstream = FakeUpstream()
        async with TestServer(upstream.app) as server, _served_proxy(_url(server)) as proxy:
            ids: dict[str, str] = {}
            # speed=1 keeps the recorded arrival times, so wall and server clocks agree
            for name in CLOCK_RECORDINGS:
                ids[name] = await _send(upstream, proxy, name, speed=1.0)
            async with _chromium() as browser:
                shown = Shown(proxy, browser, ids)
                shown.shared, _ = await shown.open()
                yield shown

    async def test_rows_are_the_requests_newest_first(self, shown: Shown) -> None:
        """The rows are exactly the requests made, newest first."""
        page = shown.page
        assert await _row_ids(page) == list(reversed(shown.ids.values()))

    async def test_chat_row_has_prefill_and_a_tick_per_token(self, shown: Shown) -> None:
        """A streamed chat's row: one prefill segment, one decode tick per predicted token,
        no tool marker."""
        page = shown.page
        chat = page.locator(f'.row[data-id="{shown.ids["chat_stream"]}"]')
        assert await chat.locator(".seg.prefill").count() == 1
        assert await chat.locator(".tool-marker").count() == 0
        ticks = shown.record("chat_stream").predicted_n
        assert await chat.locator(f'.ticks[data-ticks="{ticks}"]').count() == 1

    async def test_each_row_names_its_api(self, shown: Shown) -> None:
        """A row carries the record's API, and says it beside the kind."""
        page = shown.page
        chat = page.locator(f'.row[data-id="{shown.ids["chat_stream"]}"]')
        assert await chat.get_attribute("data-api") == shown.record("chat_stream").api
        assert await chat.locator(".api").text_content() == " chat.completions"

    async def test_tool_row_has_prefill_decode_and_a_valid_call(self, shown: Shown) -> None:
        """A streamed tool call's row: prefill, decode, and the call marked valid."""
        page = shown.page
        tool = page.locator(f'.row[data-id="{shown.ids["tool_stream"]}"]')
        assert await tool.locator(".seg.prefill").count() == 1
        assert await tool.locator(".seg.decode").count() == 1
        assert await tool.locator(".tool-marker.valid").count() == 1

    async def test_non_stream_row_says_so_and_marks_its_call(self, shown: Shown) -> None:
        """A non-streamed tool call's row is labelled non-stream and marks its call."""
        page = shown.page
        nostream = page.locator(f'.row[data-id="{shown.ids["tool_nostream"]}"]')
        assert "non-stream" in (await nostream.text_content() or "")
        assert await nostream.locator(".tool-marker").count() == 1

    async def test_failed_request_row_shows_status_as_error(self, shown: Shown) -> None:
        """A request the upstream refused (400) has an error row showing the status."""
        page = shown.page
        failed = page.locator(f'.row[data-id="{shown.ids["error_context"]}"]')
        assert "400" in (await failed.text_content() or "")
        assert await failed.evaluate("r => r.classList.contains('err')")

    async def test_upstream_errors_are_counted_by_status(self, shown: Shown) -> None:
        """The outcomes card names the upstream's error statuses and their counts, from
        /stats upstream_errors (the 400 answer is outcome upstream_error, not completed)."""
        badge = shown.page.locator('[data-field="http-errors"]')
        assert (await badge.text_content() or "").strip() == "upstream HTTP 400 ×1"

    async def test_summary_counts_each_kind(self, shown: Shown) -> None:
        """The summary cards count the requests of each kind and split the chat time."""
        page = shown.page
        kinds = [r.kind for r in shown.proxy.captured.records]
        assert await _count(page, "chat") == str(kinds.count(Kind.CHAT))
        assert await _count(page, "tool") == str(kinds.count(Kind.TOOL))
        assert await page.locator('.kindcard[data-kind="chat"] [data-field="split"]').count() == 1

    async def test_clicking_a_row_opens_its_record(self, shown: Shown) -> None:
        """Clicking a row shows that request's record in the detail panel."""
        page, _ = await shown.open()
        await page.locator(f'.row[data-id="{shown.ids["tool_stream"]}"]').click()
        await page.wait_for_selector("#detail .kv")
        assert shown.ids["tool_stream"] in (await page.text_content("#detail") or "")

    async def test_page_renders_a_screenshot(
        self, shown: Shown, request: pytest.FixtureRequest
    ) -> None:
        """The page renders a non-trivial full-page screenshot (kept as an artefact)."""
        page = shown.page
        path = _artifacts() / "dashboard.png"
        await page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000
        terminal_log(request.config, "dashboard")(f"dashboard screenshot: {path.resolve()}")

    async def test_page_logs_no_error(self, shown: Shown) -> None:
        """Loading, polling and opening a record log no console error and raise nothing."""
        page, errors = await shown.open()
        await page.locator(f'.row[data-id="{shown.ids["chat_stream"]}"]').click()
        await page.wait_for_selector("#detail .kv")
        polls = await page.evaluate("window.timingProxyDashboard.polls")
        await page.wait_for_function(
            f"() => window.timingProxyDashboard.polls > {polls}", timeout=5000
        )
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
    await page.goto(proxy.admin_url + "/dashboard")
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


HOSTILE = '<img src=x onerror="window.__xss=1">'


def _many_records() -> list[Record]:
    """5,000 synthetic records, the newest a chat whose model name is markup."""
    records = _synthetic_records(5000)
    records[-1] = Record(
        **{
            **records[-1].to_dict(),
            "kind": Kind.CHAT,
            "outcome": Outcome.COMPLETED,
            "model": HOSTILE,
        }
    )
    return records


@pytest.mark.asyncio(loop_scope="class")
class TestManyRecords:
    """5,000 recent records in the proxy's own /stats: the page stays small and usable."""

    RECORDS = _many_records()

    @pytest_asyncio.fixture(scope="class", loop_scope="class")
    async def shown(self) -> AsyncIterator[Shown]:
        """A proxy whose /stats holds the 5,000 records; one browser for the class."""
        async with _served_proxy("http://127.0.0.1:9", stats={"recent": 5000}) as proxy:
            stats = proxy.app[STATS]
            for r in self.RECORDS:
                stats.add(r)
            ids = {"oldest": _id(self.RECORDS[0]), "newest": _id(self.RECORDS[-1])}
            async with _chromium() as browser:
                shown = Shown(proxy, browser, ids)
                shown.shared, _ = await shown.open()
                yield shown

    async def test_newest_record_is_the_first_row(
        self, shown: Shown, request: pytest.FixtureRequest
    ) -> None:
        """The newest of 5,000 records is the first row (the page's timings are printed,
        not asserted: they measure the shared machine as much as the page)."""
        t0 = time.perf_counter()
        page, _ = await shown.open()
        elapsed = time.perf_counter() - t0
        diag = await page.evaluate("window.timingProxyDashboard")
        terminal_log(request.config, "dashboard")(
            f"5,000 records: first row after {elapsed:.2f} s; first document on screen "
            f"{diag['firstDataMs']:.0f} ms, applied in {diag['applyMs']:.0f} ms"
        )
        assert (await _row_ids(page))[0] == shown.ids["newest"]

    async def test_large_document_is_polled_less_often(self, shown: Shown) -> None:
        """A 5,000-record /stats is polled less often than every second."""
        page = shown.page
        assert (await page.evaluate("window.timingProxyDashboard"))["interval"] > 1000

    async def test_only_visible_rows_are_in_the_dom(self, shown: Shown) -> None:
        """Only the rows on screen are elements: a bounded DOM for 5,000 records."""
        page = shown.page
        rows = await page.locator(ROW).count()
        assert 0 < rows <= 80, f"{rows} row elements for 5,000 records"
        assert await page.evaluate("document.getElementsByTagName('*').length") < 4000

    async def test_model_name_is_text_not_markup(self, shown: Shown) -> None:
        """A model name holding markup is shown as text and never runs."""
        page = shown.page
        newest = page.locator(f'.row[data-id="{shown.ids["newest"]}"]')
        assert HOSTILE in (await newest.text_content() or "")
        assert await page.evaluate("window.__xss === undefined")
        assert await page.locator("#canvas img").count() == 0

    async def test_scrolling_to_the_end_shows_the_oldest(self, shown: Shown) -> None:
        """Scrolled to the end, the oldest record is rendered, the DOM still bounded."""
        page, _ = await shown.open()
        await page.eval_on_selector("#viewport", "v => { v.scrollTop = v.scrollHeight; }")
        await page.wait_for_selector(f'.row[data-id="{shown.ids["oldest"]}"]', timeout=5000)
        assert await page.locator(ROW).count() <= 80

    async def test_kind_filter_shows_only_that_kind(self, shown: Shown) -> None:
        """Filtering by kind leaves only rows of that kind, still bounded."""
        page, _ = await shown.open()
        await page.select_option("#fkind", "tool")
        await page.wait_for_function(
            "() => [...document.querySelectorAll('.row[data-id]')]"
            ".every(r => r.dataset.kind === 'tool')"
        )
        assert 0 < await page.locator(ROW).count() <= 80

    async def test_fit_scale_marks_valid_and_invalid_calls(self, shown: Shown) -> None:
        """Tool rows on the fit scale mark their calls, invalid ones apart."""
        page, _ = await shown.open()
        await page.select_option("#fkind", "tool")
        await page.select_option("#scale", "fit")
        await page.wait_for_selector(".row .tool-marker.invalid", timeout=5000)
        assert await page.locator(".row .tool-marker").count() > 0

    async def test_summary_counts_all_records(self, shown: Shown) -> None:
        """The summary counts every record of the kind, not only the rendered ones."""
        page = shown.page
        tools = sum(r.kind is Kind.TOOL for r in self.RECORDS)
        assert await _count(page, "tool") == f"{tools:,}"

    async def test_polling_and_browsing_log_no_error(self, shown: Shown) -> None:
        """Polls of the 5,000 records, scrolling and filtering log no error."""
        page, errors = await shown.open()
        await page.eval_on_selector("#viewport", "v => { v.scrollTop = v.scrollHeight; }")
        await page.select_option("#fkind", "tool")
        await page.select_option("#scale", "fit")
        await page.wait_for_timeout(1500)  # the polls go on
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
    await page.goto(proxy.admin_url + "/dashboard")
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
    await page.goto(proxy.admin_url + "/dashboard")
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
    await page2.goto(proxy.admin_url + "/dashboard?token=s3cret")
    await page2.wait_for_selector(f'.row[data-id="{records[-1].id}"]', timeout=5000)
    assert await page2.is_hidden("#auth")
    # the browser console logs the 401 response itself; the page adds no error of its own
    assert [e for e in errors + errors2 if "401" not in e] == []


# ------------------------------------------------------------------------------------------
# Prefix attribution: the divergence on a request's clock, the findings card


def _diverged(record: Record, cached: int | None, frac: float, **fields: Any) -> Record:
    """``record`` (which has a prefill) rewritten so that its prompt diverged ``frac`` of the
    way through the tokens it prefilled (``cached`` of its prompt from the cache)."""
    assert record.prompt_tokens is not None
    evaluated = record.prompt_tokens - (cached or 0)
    return Record(
        **{
            **record.to_dict(),
            "kind": record.kind,
            "outcome": record.outcome,
            "cache_n": cached,
            "prompt_n": evaluated,
            "prefix_kind": "rewrite",
            "diverged_at": (cached or 0) + round(frac * evaluated),
            **fields,
        }
    )


def _attributed_records() -> list[Record]:
    """20 synthetic records, the newest three with a divergence (no cache; a quarter into
    what was prefilled after a partial cache hit; and one whose section is markup)."""
    records = [r for r in _synthetic_records(40) if r.prefill_ms and r.prompt_tokens][:20]
    records[-1] = _diverged(
        records[-1],
        0,
        0.6,
        diverged_section="messages[0].content",
        prefill_cause="system_prompt_changed",
        prefill_lost_ms=412.5,
    )
    records[-2] = _diverged(
        records[-2],
        (records[-2].prompt_tokens or 0) // 2,
        0.25,
        diverged_section="tools[1]:run_shell",
        prefill_cause="tools_changed",
        prefill_lost_ms=99.0,
    )
    records[-3] = _diverged(
        records[-3], None, 0.5, diverged_section=HOSTILE, prefill_cause="history_rewritten"
    )
    return records


def _findings(n: int) -> list[dict[str, Any]]:
    """``n`` findings in /stats's shape, most ms first; the second's section is markup."""
    causes = list(Cause)
    out = [
        Finding(
            causes[i % len(causes)],
            HOSTILE if i == 1 else f"messages[{i}].content",
            requests=i + 1,
            tokens=100 * (n - i),
            ms=1000.0 * (n - i),
        ).to_dict()
        for i in range(n)
    ]
    return out


async def _marker(page: Page, rid: str) -> dict[str, Any]:
    """The divergence mark of row ``rid``: its data, tooltip and place on the prefill bar."""
    got: dict[str, Any] = await page.eval_on_selector(
        f'.row[data-id="{rid}"]',
        """row => {
            const m = row.querySelector('[data-field="diverged"]');
            const bar = row.querySelector('.seg.prefill');
            const x = Number(m.querySelector('line').getAttribute('x1'));
            const bx = Number(bar.getAttribute('x')), bw = Number(bar.getAttribute('width'));
            return { section: m.dataset.section, cause: m.dataset.cause,
                     title: m.querySelector(':scope > title').textContent,
                     at: (x - bx) / bw, width: bw };
        }""",
    )
    return got


async def test_dashboard_marks_where_the_prompt_diverged(
    make_proxy: ProxyFactory, browser: Browser
) -> None:
    """A request whose prompt diverged has a mark on its prefill bar where diverged_at
    falls among the tokens it prefilled (cache_n … prompt_tokens), its tooltip naming the
    section and the cause (markup as text); requests without a divergence have none."""
    records = _attributed_records()
    proxy = await make_proxy("http://127.0.0.1:9")
    page = await _new_page(browser)
    errors = _watch(page)
    await page.route("**/stats", _serve(_stats_doc(records)))
    await page.goto(proxy.admin_url + "/dashboard")
    await page.wait_for_selector(f'.row[data-id="{records[-1].id}"]', timeout=5000)
    await page.select_option("#scale", "fit")  # every prefill bar wide enough to measure
    diverged = [r for r in records if r.diverged_at is not None]
    for r in diverged:
        assert r.id is not None and r.diverged_at is not None and r.prompt_tokens is not None
        await page.wait_for_selector(f'.row[data-id="{r.id}"] [data-field="diverged"]')
        mark = await _marker(page, r.id)
        cached = r.cache_n or 0
        expected = (r.diverged_at - cached) / (r.prompt_tokens - cached)
        assert mark["at"] == pytest.approx(expected, abs=1.5 / mark["width"] + 0.01), r.id
        assert (mark["section"], mark["cause"]) == (r.diverged_section, r.prefill_cause)
        assert f"in {r.diverged_section}" in mark["title"]
        assert f"cause: {r.prefill_cause}" in mark["title"]
    marks = await page.locator('#canvas [data-field="diverged"]').count()
    assert marks == len(diverged)
    assert await page.evaluate("window.__xss === undefined")
    assert await page.locator("#canvas img").count() == 0
    assert errors == []


async def test_dashboard_lists_the_top_findings(make_proxy: ProxyFactory, browser: Browser) -> None:
    """The findings card lists the first 8 of /stats cache.findings in their order, each
    with its cause, section, requests, ms lost and fix (markup as text), and says how many
    more there are; without cache.findings it says attribution is off."""
    records = _synthetic_records(5)
    found = _findings(10)
    stats = orjson.loads(_stats_doc(records))
    stats["cache"]["findings"] = found
    proxy = await make_proxy("http://127.0.0.1:9")
    page = await _new_page(browser)
    errors = _watch(page)
    await page.route("**/stats", _serve(orjson.dumps(stats)))
    await page.goto(proxy.admin_url + "/dashboard")
    await page.wait_for_selector("#findingsbody tr[data-cause]", timeout=5000)
    rows = await page.eval_on_selector_all(
        "#findingsbody tr[data-cause]",
        """rows => rows.map(r => Object.fromEntries(
            [...r.querySelectorAll('[data-field]')].map(c => [c.dataset.field, c.textContent])))""",
    )
    assert [(r["cause"], r["section"], r["requests"], r["fix"]) for r in rows] == [
        (f["cause"], f["section"], str(f["requests"]), f["fix"]) for f in found[:8]
    ]
    assert rows[0]["ms"] == "10.0 s" and rows[-1]["ms"] == "3.00 s"
    assert "2 more" in (await page.text_content("#findings") or "")
    assert await page.evaluate("window.__xss === undefined")
    assert await page.locator("#findingsbody img").count() == 0

    page2 = await _new_page(browser)
    errors2 = _watch(page2)
    await page2.route("**/stats", _serve(_stats_doc(records)))
    await page2.goto(proxy.admin_url + "/dashboard")
    await page2.wait_for_function(
        "() => document.querySelector('#findingsbody').textContent.includes('attribution is off')",
        timeout=5000,
    )
    assert errors + errors2 == []


async def test_dashboard_hatches_the_image_part_of_the_prefill(
    make_proxy: ProxyFactory, browser: Browser
) -> None:
    """A request whose images were prefilled has an image hatch on its prefill bar, as wide
    as image_prefill_ms is of prefill_ms and right after the schema's; a request whose
    images came from the cache (image_prefill_ms 0) has none, and its tooltip says so."""
    records = [r for r in _synthetic_records(30) if r.prefill_ms and r.kind is Kind.CHAT][:4]
    assert len(records) == 4
    paid, cached = records[-1], records[-2]
    assert paid.prefill_ms is not None
    images: dict[str, Any] = {"images": 1, "image_tokens": 259}
    records[-1] = Record(
        **{
            **paid.to_dict(),
            "kind": paid.kind,
            "outcome": paid.outcome,
            **images,
            "images_cached": 0,
            "image_prefill_ms": paid.prefill_ms * 0.5,
        }
    )
    records[-2] = Record(
        **{
            **cached.to_dict(),
            "kind": cached.kind,
            "outcome": cached.outcome,
            **images,
            "images_cached": 1,
            "image_prefill_ms": 0.0,
        }
    )
    proxy = await make_proxy("http://127.0.0.1:9")
    page = await _new_page(browser)
    errors = _watch(page)
    await page.route("**/stats", _serve(_stats_doc(records)))
    await page.goto(proxy.admin_url + "/dashboard")
    await page.wait_for_selector(f'.row[data-id="{paid.id}"] .seg.image', timeout=5000)
    await page.select_option("#scale", "fit")
    share = await page.eval_on_selector(
        f'.row[data-id="{paid.id}"]',
        """row => {
            const bar = row.querySelector('.seg.prefill'), img = row.querySelector('.seg.image');
            const w = (e) => Number(e.getAttribute('width'));
            return { share: w(img) / w(bar), width: w(bar),
                     start: Number(img.getAttribute('x')) - Number(bar.getAttribute('x')),
                     title: row.querySelector('svg.clock > title').textContent };
        }""",
    )
    assert share["share"] == pytest.approx(0.5, abs=2.0 / share["width"] + 0.01)
    assert share["start"] == pytest.approx(0.0, abs=1.5)  # no schema before it
    assert "1 image: 259 tokens · 0 from the cache" in share["title"]
    assert await page.locator(f'.row[data-id="{cached.id}"] .seg.image').count() == 0
    title = await page.eval_on_selector(
        f'.row[data-id="{cached.id}"] svg.clock', "svg => svg.querySelector('title').textContent"
    )
    assert "1 from the cache" in title
    assert errors == []


async def test_dashboard_shows_setup_findings_first_and_only_when_present(
    make_proxy: ProxyFactory, browser: Browser
) -> None:
    """/stats findings of category setup fill the "fix these first" card, one row per cause
    and model with its fix (markup as text); cache findings are not in it; with none the
    card stays hidden."""
    records = _synthetic_records(5)
    stats = orjson.loads(_stats_doc(records))
    stats["findings"] = [
        {
            "category": "setup",
            "cause": "tools_never_reach_model",
            "model": "gemma<b>",
            "requests": 5,
            "tokens": 240,
            "ms": 4210.0,
            "detail": {},
            "fix": "start llama-server with --jinja <i>and</i> a tool template",
        },
        {"category": "cache", "cause": "tools_changed", "requests": 2, "fix": "same tools"},
    ]
    proxy = await make_proxy("http://127.0.0.1:9")
    page = await _new_page(browser)
    errors = _watch(page)
    await page.route("**/stats", _serve(orjson.dumps(stats)))
    await page.goto(proxy.admin_url + "/dashboard")
    await page.wait_for_selector('#setup tr[data-cause="tools_never_reach_model"]', timeout=5000)
    assert await page.is_visible("#setup")
    rows = page.locator("#setupbody tr[data-cause]")
    assert await rows.count() == 1
    text = await rows.first.text_content() or ""
    assert "gemma<b>" in text and "4.21 s" in text and "--jinja <i>and</i>" in text
    assert await page.locator("#setupbody b, #setupbody i").count() == 0
    quiet = await _new_page(browser)
    await quiet.route("**/stats", _serve(_stats_doc(records)))
    await quiet.goto(proxy.admin_url + "/dashboard")
    await quiet.wait_for_selector(f'.row[data-id="{records[-1].id}"]', timeout=5000)
    assert not await quiet.is_visible("#setup")
    assert errors == []
