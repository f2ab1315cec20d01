"""Tests for proxy.core.in_flight: which requests to one prompt cache were in flight at a
moment, and what is kept for the requests still to ask."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.in_flight import InFlight


def test_in_flight_means_sent_by_then_and_not_ended() -> None:
    """At a moment, the others to the same cache that were sent at or before it and had not
    ended: not one that ended by then, not one sent after, not one of another cache, never
    the asker itself."""
    flights: InFlight[str] = InFlight()
    asker = flights.open("m", 10.0, "asker")
    running = flights.open("m", 9.0, "running")
    ended_before = flights.open("m", 8.0, "ended before")
    later = flights.open("m", 12.0, "sent later")
    elsewhere = flights.open("other", 9.0, "other cache")
    flights.ended(ended_before, 10.5)
    flights.ended(running, 20.0)
    flights.ended(later, 13.0)
    flights.ended(asker, 15.0)
    assert flights.beside(asker, 11.0) == ["running"]
    assert flights.beside(asker, 10.0) == ["running", "ended before"]
    assert flights.beside(elsewhere, 11.0) == []
    assert flights.end_of(asker) == 15.0
    assert flights.item(later) == "sent later"


def test_a_request_alone_has_nobody_beside_it() -> None:
    """One request after another (each ended before the next was sent): nobody beside any."""
    flights: InFlight[int] = InFlight()
    for i in range(5):
        ticket = flights.open("m", float(i), i)
        flights.ended(ticket, i + 0.5)
        assert flights.beside(ticket, i + 0.25) == []
        flights.settle(ticket)
    assert len(flights) == 0


def test_kept_while_an_unsettled_request_may_still_ask() -> None:
    """A settled request is kept while one sent before its end is unsettled (that one may
    yet find it beside it), and forgotten once no such one is left."""
    flights: InFlight[str] = InFlight()
    first = flights.open("m", 0.0, "first")
    second = flights.open("m", 1.0, "second")
    flights.ended(first, 5.0)
    flights.settle(first)
    assert len(flights) == 2
    flights.ended(second, 6.0)
    assert flights.beside(second, 2.0) == ["first"]
    flights.settle(second)
    assert len(flights) == 0
    assert flights.beside(second, 2.0) == []
    assert flights.end_of(second) is None


@given(st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=40))
def test_never_more_than_the_limit(limit: int, opened: int) -> None:
    """However many are opened and never settled, at most ``limit`` are kept, the latest."""
    flights: InFlight[int] = InFlight(limit=limit)
    tickets = [flights.open("m", float(i), i) for i in range(opened)]
    assert len(flights) == min(limit, opened)
    kept = [flights.item(t) for t in tickets[-limit:]] if opened else []
    assert kept == list(range(max(0, opened - limit), opened))
