"""The rest of the robot's bill, measured: image tokens (cold, cached, another image), a
speculative request, and energy from a replayed tegrastats, each as the proxy recorded it.

Three llama-servers are started in turn from the provisioned binary and Gemma 3 270M:

- with ``--mmproj`` on a Gemma 3 projector generated here (random weights, the shape of the
  real one: the accounting is real, the answers are not), a proxy in front, and three
  requests with a 224x224 PNG: an image never seen, the same again, a different one; the
  script counts the image's tokens itself (``/v1/chat/completions/input_tokens`` with and
  without the image) to put beside the record;
- with the model as its own draft (``-md``, ``--spec-type draft-simple``), one streamed
  request, its final ``timings`` beside the record;
- the first server again behind a proxy whose ``[board] telemetry`` runs
  ``tests/fake_tegrastats.py`` (real Orin Nano lines at a constant ``VDD_IN``): the expected
  energy is that power times the record's own wall interval.

    .venv/bin/python bench/bill_records.py [--out bench/results/NAME.json]

Greedy decoding (``temperature: 0``): the same build and model give the same tokens; times
depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from api_records import _events, _post, _proxy, _record, _send, _upstream  # noqa: E402 - bench/ is this script's own folder

from tests.images_fixture import data_url, solid_png, write_gemma3_projector  # noqa: E402

POWER_MW = 5000
FAKE_TEGRASTATS = CHECKOUT / "tests" / "fake_tegrastats.py"
IMAGE_FIELDS = (
    "images image_tokens image_tokens_each images_cached image_prefill_ms prompt_n "
    "cache_n prefill_ms accounting_error"
)
DRAFT_FIELDS = "predicted_n decode_ms decode_tok_s draft_n draft_n_accepted draft_acceptance"
BOARD_FIELDS = (
    "e2e_ms predicted_n energy_mj energy_mj_per_token power_w_avg gpu_busy_pct ram_used_mb "
    "temp_max_c telemetry_error"
)


def _stream(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A streamed request: the last ``timings`` of the stream, and the request id."""
    sent = _send(url, "", body, ())
    events = [e for e in _events(sent["raw"]) if "timings" in e]
    return (events[-1]["timings"] if events else {}), sent["id"]


def _image_turn(png: bytes) -> dict[str, Any]:
    return {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this picture?"},
                    {"type": "image_url", "image_url": {"url": data_url(png)}},
                ],
            }
        ],
        "max_tokens": 4,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": False},
    }


def _input_tokens(upstream: str, body: dict[str, Any]) -> int:
    got, _ = _post(upstream + "/v1/chat/completions/input_tokens", body)
    return int(got["input_tokens"])


def images(folder: Path) -> list[dict[str, Any]]:
    """An image never seen, the same image again, a different one."""
    projector = write_gemma3_projector(folder / "mmproj-gemma3.gguf")
    red, blue = solid_png((200, 30, 30)), solid_png((30, 30, 200))
    out = []
    with (
        _upstream(None, folder / "llama-mmproj", ["--mmproj", str(projector)]) as upstream,
        _proxy(upstream, folder / "proxy-images") as (base, log),
    ):
        for name, png in (("cold", red), ("same image again", red), ("another image", blue)):
            body = _image_turn(png)
            bare = {**body, "messages": [{"role": "user", "content": "What is in this picture?"}]}
            expected = _input_tokens(upstream, body) - _input_tokens(upstream, bare)
            _, request_id = _post(base + "/v1/chat/completions", body)
            record = _record(log, request_id, fields=IMAGE_FIELDS)
            out.append({"request": name, "independent_image_tokens": expected, "record": record})
    return out


def speculative(folder: Path, model: str) -> dict[str, Any]:
    """One streamed request to a server drafting with its own model."""
    args = ["-md", model, "--spec-type", "draft-simple", "--spec-draft-n-max", "8"]
    body = {
        "messages": [{"role": "user", "content": "Count from 1 to 30, separated by commas."}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    with (
        _upstream(None, folder / "llama-draft", args) as upstream,
        _proxy(upstream, folder / "proxy-draft") as (base, log),
    ):
        timings, request_id = _stream(base + "/v1/chat/completions", body)
        record = _record(log, request_id, fields=DRAFT_FIELDS)
    return {
        "server_timings": {
            k: timings.get(k) for k in ("predicted_n", "draft_n", "draft_n_accepted")
        },
        "record": record,
    }


def board(folder: Path) -> list[dict[str, Any]]:
    """Three chats with tegrastats replayed at a constant input power."""
    wrapper = folder / "tegrastats"
    wrapper.write_text(
        f'#!/bin/sh\nexec {sys.executable} {FAKE_TEGRASTATS} --power-mw {POWER_MW} "$@"\n'
    )
    wrapper.chmod(0o755)
    config = (
        f'[board]\ntelemetry = "tegrastats"\ntegrastats_path = "{wrapper}"\n'
        "telemetry_interval_ms = 50\n"
    )
    body = {
        "messages": [{"role": "user", "content": "Name three tools a robot arm might use."}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    out = []
    with (
        _upstream(None, folder / "llama-board") as upstream,
        _proxy(upstream, folder / "proxy-board", config) as (base, log),
    ):
        time.sleep(1.0)  # the sampler's first lines
        for _ in range(3):
            _, request_id = _stream(base + "/v1/chat/completions", body)
            record = _record(log, request_id, fields=BOARD_FIELDS)
            expected = POWER_MW / 1000.0 * record["e2e_ms"]
            out.append({"expected_energy_mj": round(expected, 3), "record": record})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file (default: bench/results/...)")
    args = parser.parse_args()
    from proxy.commands.provision import ensure_model

    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    out = args.out or CHECKOUT / "bench" / "results" / f"bill_records-{stamp}.json"
    with tempfile.TemporaryDirectory(prefix="bill-") as tmp:
        folder = Path(tmp)
        result = {
            "when": stamp,
            "images": images(folder),
            "speculative": speculative(folder, str(ensure_model())),
            "board": board(folder),
        }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
