"""What the configuration exposes, said once at start, one warning line each.

- ``agent_listener_exposed``: the agent's listener (``[server] host``) binds beyond loopback.
  The proxy checks no credential on that port (only llama-server's ``--api-key`` checks the
  agents' requests), so anyone who reaches the address uses the model through it.
- ``admin_listener_exposed``: the admin listener (``[admin] listen``) binds beyond loopback
  without ``[admin] auth_token``: ``/stats``, ``/metrics`` and ``/dashboard`` are open to anyone
  who reaches it.
- ``upstream_metrics_not_merged``: ``[upstream] api_key`` is set but ``[admin] auth_token`` is
  not. An admin page nobody authenticated never sends the proxy's key upstream, so a
  llama-server that wants it answers its ``/metrics`` with a 401 and the proxy's page carries
  its own metrics only.
- ``diff_text_shown``: ``[privacy] show_diff_text`` is on: prompt text goes into the records
  (the log, ``/stats``, the dashboard).

Loopback is ``localhost`` or an address ``ipaddress`` calls loopback (``127.0.0.0/8``,
``::1``); any other host, a name included, counts as beyond it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.config import Config, parse_listen

__all__ = ["StartupWarning", "is_loopback", "startup_warnings", "warn_at_start"]


@dataclass(frozen=True, slots=True)
class StartupWarning:
    """One warning line: its event name and fields."""

    event: str
    fields: Mapping[str, str]


def is_loopback(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost
        return False


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def startup_warnings(config: Config) -> list[StartupWarning]:
    """The warnings ``config`` deserves, in the order they are logged (none for the
    defaults: both listeners on loopback, no key, no prompt text)."""
    out: list[StartupWarning] = []
    server = config.server
    if not is_loopback(server.host):
        out.append(
            StartupWarning(
                "agent_listener_exposed",
                {
                    "listen": _address(server.host, server.port),
                    "why": "the proxy checks no credential on the agent's port: whoever reaches"
                    " it uses llama-server, whose --api-key is the only check",
                    "fix": "[server] host = 127.0.0.1, or a firewall, unless robots on the"
                    " network must reach it",
                },
            )
        )
    token = config.admin.auth_token
    admin_host, _ = parse_listen(config.admin.listen)
    if token is None and not is_loopback(admin_host):
        out.append(
            StartupWarning(
                "admin_listener_exposed",
                {
                    "listen": config.admin.listen,
                    "why": "/stats, /metrics and /dashboard answer anyone who reaches it",
                    "fix": "set [admin] auth_token, or [admin] listen on 127.0.0.1",
                },
            )
        )
    if token is None and config.upstream.api_key is not None:
        out.append(
            StartupWarning(
                "upstream_metrics_not_merged",
                {
                    "why": "without [admin] auth_token no admin page is authenticated, so"
                    " /metrics asks llama-server for its metrics without [upstream] api_key",
                    "fix": "set [admin] auth_token to merge them",
                },
            )
        )
    if config.privacy.show_diff_text:
        out.append(
            StartupWarning(
                "diff_text_shown",
                {
                    "why": "[privacy] show_diff_text is on: up to 80 characters of prompt text"
                    " on each side of a change go into the records (the log, /stats, the"
                    " dashboard)",
                    "fix": "[privacy] show_diff_text = false",
                },
            )
        )
    return out


def warn_at_start(config: Config, log: Any) -> None:
    """Log each of :func:`startup_warnings` as one warning line."""
    for warning in startup_warnings(config):
        log.warning(warning.event, **warning.fields)
