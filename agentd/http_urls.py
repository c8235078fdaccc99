"""Whether a URL the daemon will later send requests to can be sent to at all."""

from __future__ import annotations

from urllib.parse import urlparse


def usable_http_url(url: str) -> bool:
    """An http(s) URL with a host and a port in range that requests can send to: no
    whitespace or control characters, no unclosed IPv6 bracket (`http://[`)."""
    import requests  # here, not at start: requests loads with the first use that needs it

    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return False
    try:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.hostname is None:
            return False
        parsed.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        requests.models.PreparedRequest().prepare_url(url, None)
    except (ValueError, requests.exceptions.RequestException):
        return False
    return True
