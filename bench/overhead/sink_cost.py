"""CPU per record of the work after the response: the record sinks (``/stats``, ``/metrics``,
the ``request_completed`` line, the setup watch) each and together, ``Record.to_dict`` and
one ``dataclasses.replace``. In-process, no I/O (the log line goes to /dev/null), the
process's CPU clock over ``--records`` records.

    .venv/bin/python -m bench.overhead.sink_cost [--records 20000]

Run it from two checkouts one after the other to compare (``git archive`` one into /tmp).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from proxy.config import Config
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import analyse_request
from proxy.core.roofline import Board
from proxy.core.stats import Stats
from proxy.serve.logs import configure_logging, get_logger
from proxy.serve.metrics import Metrics
from proxy.serve.model_info import ModelInfo
from proxy.serve.setup_watch import SetupWatch
from proxy.serve.sinks import RecordSinks

BODY = {
    "model": "m",
    "stream": True,
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hi"}],
}


def _record(i: int) -> Record:
    """A streamed chat record as the bench's 100-event stream gives it."""
    return Record(
        id=f"{i:016x}",
        ts="2026-12-01T01:00:00.000000Z",
        method="POST",
        path="/v1/chat/completions",
        model="m",
        stream=True,
        kind=Kind.CHAT,
        api="chat_completions",
        status=200,
        outcome=Outcome.COMPLETED,
        ttfb_ms=0.3,
        ttft_ms=0.31,
        e2e_ms=0.9,
        decode_wall_ms=0.5,
        prefill_ms=1.2,
        decode_ms=3.0,
        prompt_n=10,
        cache_n=2,
        predicted_n=97,
        prefill_tok_s=1000.0,
        decode_tok_s=300.0,
        prompt_tokens=12,
        cache_hit_ratio=0.16,
        overhead_ms=-0.9,
        prefill_share=0.3,
        max_tokens=100,
        finish_reason="stop",
        events=99,
        token_events=97,
        request_bytes=200,
        response_bytes=20000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    n = parser.parse_args().records
    devnull = open(os.devnull, "wb")  # noqa: SIM115 - lives as long as the script
    configure_logging(stream=devnull)
    stats, metrics = Stats(since="bench"), Metrics()
    model_info = ModelInfo("http://127.0.0.1:1", Board.from_config(Config().board))
    sinks = RecordSinks(stats, metrics, model_info, get_logger())
    watch = SetupWatch("http://127.0.0.1:1", get_logger())
    sinks.sinks.append(watch.sink)
    facts = analyse_request("POST", "/v1/chat/completions", orjson.dumps(BODY))
    records = [_record(i) for i in range(n)]

    def timed(name: str, fn: Callable[[Record, Any, Any], object]) -> None:
        t0 = time.process_time()
        for record in records:
            fn(record, facts, None)
        print(f"{name:28s} {(time.process_time() - t0) / n * 1e6:7.2f} µs per record")

    timed("all sinks (first pass)", sinks)
    timed("all sinks", sinks)
    timed("  /stats add", sinks.count_record)
    timed("  /metrics observe", metrics.observe)
    timed("  request_completed line", sinks.log_record)
    timed("  setup watch", watch.sink)
    timed("Record.to_dict", lambda r, *_: r.to_dict())
    timed("dataclasses.replace (1 field)", lambda r, *_: dataclasses.replace(r, error="x"))


if __name__ == "__main__":
    main()
