"""Container health check for timing-proxy: exit 0 if the proxy answers, 1 if it does not.

Usage: ``python healthcheck.py [URL]`` (default ``http://127.0.0.1:8081/stats``).

Standard library only (the slim image has no curl). The proxy counts as alive when the URL
answers 2xx, or 401: with ``[admin] auth_token`` set (the image sets it), ``/stats`` wants the
bearer token, and a 401 still proves that the event loop runs and answers. Anything else (no
answer within the timeout, a refused connection, another status) is unhealthy. Environment
proxies (``HTTP_PROXY`` ...) are ignored: the check must reach the container's own loopback.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8081/stats"
TIMEOUT_S = 4.0  # below the HEALTHCHECK --timeout, so the script reports before Docker kills it


def probe(url: str, timeout: float = TIMEOUT_S) -> tuple[bool, str]:
    """(alive, what was seen) for one GET of ``url``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            status = int(resp.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
        exc.close()
    except (OSError, ValueError) as exc:  # refused, reset, timeout, DNS, malformed URL
        return False, f"{url}: {exc}"
    alive = 200 <= status < 300 or status == 401
    return alive, f"{url}: HTTP {status}"


def main(argv: list[str]) -> int:
    """Probe ``argv[1]`` (or the default URL); print what was seen; 0 = healthy."""
    url = argv[1] if len(argv) > 1 else DEFAULT_URL
    alive, seen = probe(url)
    print(("healthy: " if alive else "unhealthy: ") + seen)
    return 0 if alive else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
