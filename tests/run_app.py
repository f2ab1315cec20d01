"""The proxy started the way production starts it, without a socket: ``proxy.serve.app.run``
with ``web.run_app`` replaced, so a test reads the app and the runner arguments it built."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

import proxy.serve.app
from proxy.config import Config

__all__ = ["run_app_arguments"]


def run_app_arguments(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> tuple[web.Application, dict[str, Any]]:
    """Call ``proxy.serve.app.run(config)`` with ``web.run_app`` replaced: app and kwargs."""
    got: dict[str, Any] = {}

    def fake_run_app(app: web.Application, **kwargs: Any) -> None:
        got.update(kwargs, app=app)

    with monkeypatch.context() as patch:
        patch.setattr(web, "run_app", fake_run_app)  # the module proxy.serve.app calls it from
        proxy.serve.app.run(config)
    return got.pop("app"), got
