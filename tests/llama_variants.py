"""Helpers of the prefix-attribution tests against the real server
(``tests/real/test_prefix_real.py``): a JSON POST that returns the proxy's request id."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from proxy.core.headers import REQUEST_ID_HEADER

__all__ = ["GET_WEATHER", "post_json"]

GET_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
"""The one tool of the real tests' weather requests (the Qwen3 template renders it in 173
tokens for Gemma 3 270M)."""


def post_json(url: str, body: dict[str, Any], timeout: float = 300) -> tuple[Any, str | None]:
    """POST ``body`` as JSON; the parsed answer and the proxy's request id header (if any)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        request_id = response.headers.get(REQUEST_ID_HEADER)
        return json.loads(response.read()), request_id
