"""The proxy started the way production starts it, without a socket: ``proxy.serve.app.run``
with ``web.run_app`` replaced, so a test reads the app and the runner arguments it built."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from aiohttp import web

import proxy.serve.app
from proxy.config import AdminConfig, Config

__all__ = ["run_app_arguments"]


def run_app_arguments(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> tuple[web.Application, dict[str, Any]]:
    """Call ``proxy.serve.app.run(config)`` with ``web.run_app`` replaced: app and kwargs.

    The admin listener left at its default (127.0.0.1:8082) is moved to a free port (0), so
    tests never contend for 8082 with each other or with a proxy the developer runs."""
    if config.admin.listen == AdminConfig().listen:
        config = dataclasses.replace(
            config, admin=dataclasses.replace(config.admin, listen="127.0.0.1:0")
        )
    got: dict[str, Any] = {}

    def fake_run_app(app: web.Application, **kwargs: Any) -> None:
        got.update(kwargs, app=app)

    with monkeypatch.context() as patch:
        patch.setattr(web, "run_app", fake_run_app)  # the module proxy.serve.app calls it from
        proxy.serve.app.run(config)
    return got.pop("app"), got
