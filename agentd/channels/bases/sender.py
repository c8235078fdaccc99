"""One HTTP sender for every adapter: timeouts, retries on 429/5xx honouring
Retry-After (splitting a reply at the platform's limit is agentd/channels/format's)."""

from __future__ import annotations

import logging
import socket
import threading
import weakref
from typing import Any

import requests
import requests.adapters
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from agentd.channels.adapter import ChannelError, Unreachable
from agentd.retry import Backoff, retry_after

log = logging.getLogger("agentd.channels.sender")
RETRY_STATUS = {429, 500, 502, 503, 504}


class _TrackingAdapter(requests.adapters.HTTPAdapter):
    """Remembers every socket it opens, so `abort()` can end a read blocked in another
    thread (a long poll or a stream) the moment an adapter stops."""

    def __init__(self, sockets: "weakref.WeakSet[socket.socket]") -> None:
        self._sockets = sockets
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        sockets = self._sockets

        class Http(HTTPConnection):
            def connect(self) -> None:
                super().connect()
                sockets.add(self.sock)

        class Https(HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                sockets.add(self.sock)

        class HttpPool(HTTPConnectionPool):
            ConnectionCls = Http

        class HttpsPool(HTTPSConnectionPool):
            ConnectionCls = Https

        self.poolmanager.pool_classes_by_scheme = {"http": HttpPool, "https": HttpsPool}


class HttpSender:
    """A requests.Session with the retry policy every platform call shares."""

    def __init__(self, timeout: float = 15.0, retries: int = 3, max_wait: float = 60.0,
                 stop: threading.Event | None = None, headers: dict[str, str] | None = None) -> None:
        self.session = requests.Session()
        self.session.trust_env = False  # platform URLs are configured, not taken from proxies
        self._sockets: "weakref.WeakSet[socket.socket]" = weakref.WeakSet()
        for prefix in ("http://", "https://"):
            self.session.mount(prefix, _TrackingAdapter(self._sockets))
        if headers:
            self.session.headers.update(headers)
        self.timeout, self.retries, self.max_wait = timeout, retries, max_wait
        self.stop = stop or threading.Event()

    def request(self, method: str, url: str, *, timeout: float | None = None,
                retries: int | None = None, **kwargs: Any) -> requests.Response:
        """Send; retry 429/5xx and connection errors; raise ChannelError on failure."""
        attempts = (self.retries if retries is None else retries) + 1
        backoff = Backoff(initial=0.5, maximum=self.max_wait)
        for attempt in range(attempts):
            try:
                response = self.session.request(method, url, timeout=timeout or self.timeout, **kwargs)
            except requests.RequestException as exc:
                error = f"{method} {_short(url)}: {type(exc).__name__}"
                if attempt + 1 >= attempts or backoff.wait(self.stop):
                    raise Unreachable(error) from None
                continue
            if response.status_code < 400:
                return response
            if response.status_code not in RETRY_STATUS or attempt + 1 >= attempts:
                failed = Unreachable if response.status_code in RETRY_STATUS else ChannelError
                raise failed(f"{method} {_short(url)}: HTTP {response.status_code} {response.text[:200]}")
            wait, delay = self.retry_wait(response), backoff.next_delay()
            wait = delay if wait is None else min(wait, self.max_wait)
            log.info("%s %s: HTTP %s, retrying in %.1fs", method, _short(url), response.status_code, wait)
            if self.stop.wait(wait):
                raise ChannelError(f"{method} {_short(url)}: stopped while waiting to retry")
        raise ChannelError(f"{method} {_short(url)}: no attempts left")  # pragma: no cover

    def retry_wait(self, response: requests.Response) -> float | None:
        """Seconds a 429/5xx asks us to wait: Retry-After, else the body's `retry_after`.
        Platforms that say it differently (Revolt: milliseconds) override this."""
        # Feishu/Lark say it as x-ogw-ratelimit-reset (seconds until the window resets).
        header = response.headers.get("Retry-After") or response.headers.get("x-ogw-ratelimit-reset")
        return retry_after(header) or _body_retry_after(response)

    def json(self, method: str, url: str, **kwargs: Any) -> Any:
        """`request` and decode a JSON answer."""
        response = self.request(method, url, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise ChannelError(f"{method} {_short(url)}: answer is not JSON") from None

    def abort(self) -> None:
        """Shut down every open connection: blocked reads in other threads end now."""
        for sock in list(self._sockets):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.abort()
        self.session.close()


def _body_retry_after(response: requests.Response) -> float | None:
    """Platforms that say it in the body: Telegram `parameters.retry_after`, Discord `retry_after`."""
    try:
        data = response.json()
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    value = data.get("retry_after", (data.get("parameters") or {}).get("retry_after")
                     if isinstance(data.get("parameters"), dict) else None)
    return float(value) if isinstance(value, (int, float)) and value >= 0 else None


def _short(url: str) -> str:
    # Never log a token carried in a URL path (Telegram's /bot<token>/...).
    if "/bot" in url:
        head, _, tail = url.partition("/bot")
        return head + "/bot***/" + tail.partition("/")[2]
    return url.split("?")[0]
