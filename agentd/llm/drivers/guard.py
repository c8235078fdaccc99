"""Bounding and interrupting one model call: a deadline, an idle limit and cancellation.

`requests` only knows per-socket-read timeouts, so a provider that drips one byte at a
time, or a caller that wants to stop, cannot end a call through it. Each attempt runs
under a `CallGuard`; one watchdog thread checks every active guard and, when the call
is cancelled, past its deadline or idle too long, shuts the socket down. The blocked
read in the run's own thread then returns at once, the attempt fails with the guard's
reason, and no thread is left behind waiting on a dead connection.

The guard learns the socket through a connection class mounted on the session: every
request registers its urllib3 connection with the guard of the calling thread, so the
socket can be interrupted before the headers arrive (a hang) as well as mid-body.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable

from requests.adapters import HTTPAdapter, Response, get_encoding_from_headers
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from agentd.llm.drivers.answer_head import HeadResponse

_local = threading.local()
WATCH_INTERVAL = 0.05  # seconds between watchdog checks: the precision of every bound here


class CallGuard:
    """The limits of one attempt: absolute `deadline` (monotonic), stream idle limit, cancel event."""

    def __init__(self, deadline: float, idle: float | None, cancel: threading.Event) -> None:
        self.deadline = deadline
        self.idle = idle
        self.cancel = cancel
        self.reason: str | None = None  # cancelled | timeout | idle, once tripped
        self.sent = False  # the request left (its bytes were written)
        self.reused = False  # ... on a kept-alive connection
        self.received = False  # a byte of the answer arrived
        self.last_byte: float | None = None  # set while reading a stream body
        self._conn: Any = None
        self._lock = threading.Lock()

    # -- called by the reading thread --------------------------------------------------
    def attach(self, sock: Any) -> None:
        """The socket this attempt uses; interrupted at once if the guard already tripped.

        The socket itself is kept, not the connection: http.client drops the connection's
        reference (`conn.sock = None`) when the answer says `Connection: close`, while the
        response goes on reading from the same socket."""
        if sock is None:
            return
        with self._lock:
            self._conn = sock
            tripped = self.reason is not None
        if tripped:
            self._interrupt()

    def streaming(self) -> None:
        """The body is being read as a stream: the idle limit applies from now."""
        self.last_byte = time.monotonic()

    def got_bytes(self) -> None:
        self.received = True
        if self.last_byte is not None:
            self.last_byte = time.monotonic()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    # -- called by the watchdog --------------------------------------------------------
    def check(self, now: float) -> None:
        if self.reason is not None:
            return
        if self.cancel.is_set():
            reason = "cancelled"
        elif now >= self.deadline:
            reason = "timeout"
        elif self.idle is not None and self.last_byte is not None and now - self.last_byte >= self.idle:
            reason = "idle"
        else:
            return
        with self._lock:
            self.reason = reason
        self._interrupt()

    def trip(self, reason: str) -> None:
        """Interrupt now (used when the reading thread itself decides to stop)."""
        with self._lock:
            if self.reason is None:
                self.reason = reason
        self._interrupt()

    def _interrupt(self) -> None:
        with self._lock:
            sock = self._conn
        if sock is None:
            return
        try:
            # shutdown (not close) wakes a recv blocked in another thread on Linux.
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Watchdog:
    """One thread for every guard in the process; sleeps while no call is active."""

    def __init__(self) -> None:
        self._guards: set[CallGuard] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentd-llm-watchdog", daemon=True)
        self._thread.start()

    def add(self, guard: CallGuard) -> None:
        with self._lock:
            self._guards.add(guard)
        # Cleared only by a watchdog that found no guard (under the lock, so before this
        # one was added): set, it is awake already, and setting it again costs every call
        # a condition's notify.
        if not self._wake.is_set():
            self._wake.set()

    def remove(self, guard: CallGuard) -> None:
        with self._lock:
            self._guards.discard(guard)

    def active(self) -> int:
        """How many model calls are in flight."""
        with self._lock:
            return len(self._guards)

    def _run(self) -> None:
        while True:
            self._tick()

    def _tick(self) -> None:
        """One pass: check every active guard, or sleep until a call starts."""
        with self._lock:
            guards = list(self._guards)
            if not guards:
                self._wake.clear()
        if not guards:
            self._wake.wait()
            return
        now = time.monotonic()
        for guard in guards:
            guard.check(now)
        time.sleep(WATCH_INTERVAL)


_watchdog: _Watchdog | None = None
_watchdog_lock = threading.Lock()


def watchdog() -> _Watchdog:
    """The process's watchdog, started on first use (importing this module starts no thread)."""
    global _watchdog
    current = _watchdog
    if current is not None:  # (every call asks twice: no lock once it runs)
        return current
    with _watchdog_lock:
        if _watchdog is None:
            _watchdog = _Watchdog()
        return _watchdog


def _forget_watchdog() -> None:
    # A forked child has no watchdog thread (threads do not survive fork): start its own
    # on first use instead of registering guards with a thread that does not exist there.
    global _watchdog, _watchdog_lock
    _watchdog, _watchdog_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_watchdog)


def active_calls() -> int:
    """Model calls being watched right now (0 before the first call)."""
    current = _watchdog
    return current.active() if current is not None else 0


class guarded:
    """Context manager: make `guard` the calling thread's guard and watch it."""

    def __init__(self, guard: CallGuard) -> None:
        self.guard = guard

    def __enter__(self) -> CallGuard:
        _local.guard = self.guard
        watchdog().add(self.guard)
        return self.guard

    def __exit__(self, *exc: Any) -> None:
        watchdog().remove(self.guard)
        _local.guard = None


def current_guard() -> CallGuard | None:
    return getattr(_local, "guard", None)


class _Tracked:
    """Mixin for urllib3 connections: tell the calling thread's guard which socket to interrupt."""

    sock: Any  # http.client sets it (None until connected) on every connection

    def request(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D401 - urllib3's signature
        guard = current_guard()
        if guard is not None:
            guard.reused = self.sock is not None
            guard.attach(self.sock)
        result = super().request(*args, **kwargs)  # type: ignore[misc]
        if guard is not None:
            guard.sent = True
            guard.attach(self.sock)  # the socket exists now even when this connection was new
        return result


class _OneWrite:
    """Mixin for urllib3 connections: a request's head and body leave in one socket write.

    urllib3 sends the head, then the body, with a `send` each: two TCP segments, and on
    loopback each send also does the receiving side's TCP work. Requests up to
    `GATHER_BYTES` are sent whole by the last step of `request`; larger bodies go out as
    urllib3 sends them (the head and what came before in one write)."""

    GATHER_BYTES = 64 * 1024
    _gathered: list[bytes] | None = None
    _gathered_bytes = 0

    def request(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D401 - urllib3's signature
        self._gathered, self._gathered_bytes = [], 0
        try:
            result = super().request(*args, **kwargs)  # type: ignore[misc]
            self._send_gathered()
        finally:
            self._gathered = None
        return result

    def send(self, data: Any) -> None:
        gathered = self._gathered
        if (gathered is not None and isinstance(data, bytes)
                and self._gathered_bytes + len(data) <= self.GATHER_BYTES):
            gathered.append(data)
            self._gathered_bytes += len(data)
            return
        self._send_gathered()  # (past the limit, or not bytes: the rest as it comes)
        super().send(data)  # type: ignore[misc]

    def _send_gathered(self) -> None:
        gathered = self._gathered
        # Gathering ends here: a send made while this one connects (a proxy tunnel's CONNECT)
        # must go out at once.
        self._gathered, self._gathered_bytes = None, 0
        if gathered:
            super().send(b"".join(gathered))  # type: ignore[misc]


class _TrackedHTTPConnection(_Tracked, _OneWrite, HTTPConnection):
    response_class = HeadResponse  # (answer_head.py: the same headers, parsed for less CPU)


class _TrackedHTTPSConnection(_Tracked, _OneWrite, HTTPSConnection):
    response_class = HeadResponse


class _Pool(HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _SPool(HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


class GuardedAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections register with the calling thread's guard."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _Pool, "https": _SPool}

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if hasattr(manager, "pool_classes_by_scheme"):
            manager.pool_classes_by_scheme = {"http": _Pool, "https": _SPool}
        return manager

    # (url, verify, cert) -> its pool. requests parses the URL and looks the pool up in the
    # pool manager on every call; a provider's calls all go to one URL.
    POOL_CACHE_SIZE = 256

    def _cached(self, name: str, key: Any, make: Callable[[], Any]) -> Any:
        """`make()` once per `key` in this adapter's bounded cache `name`."""
        cache: dict[Any, Any] | None = self.__dict__.get(name)
        if cache is None:  # (an unpickled adapter has no __init__ attributes)
            cache = self.__dict__[name] = {}
        value = cache.get(key)
        if value is None:
            value = make()
            if len(cache) >= self.POOL_CACHE_SIZE:
                cache.clear()
            cache[key] = value
        return value

    def get_connection_with_tls_context(self, request: Any, verify: Any, proxies: Any = None,
                                        cert: Any = None) -> Any:
        if proxies:
            return super().get_connection_with_tls_context(request, verify, proxies, cert)
        return self._cached("_pools", (request.url, verify, cert),
                            lambda: super(GuardedAdapter, self).get_connection_with_tls_context(
                                request, verify, proxies, cert))

    def request_url(self, request: Any, proxies: Any) -> str:
        # Without a proxy the URL sent is the path part of the request's URL, which requests
        # parses twice per call: parsed once per URL here.
        if proxies:
            return super().request_url(request, proxies)
        return self._cached("_paths", request.url,
                            lambda: super(GuardedAdapter, self).request_url(request, proxies))

    def build_response(self, req: Any, resp: Any) -> Response:
        # requests hands every answer to http.cookiejar, cookies or not; providers
        # set none. An answer that sets one is built by requests itself, cookies and all.
        headers = resp.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            return super().build_response(req, resp)
        response = Response()
        response.status_code = resp.status
        # urllib3's header dict is case-insensitive too and joins repeated headers as
        # requests' copy of it would: copied, a provider's dozen or two headers cost a
        # method call or two each.
        response.headers = headers
        response.encoding = get_encoding_from_headers(headers)
        response.raw = resp
        response.reason = resp.reason
        response.url = req.url  # (always text once prepared)
        response.request = req
        response.connection = self
        return response

    def close(self) -> None:
        self.__dict__.pop("_pools", None)
        self.__dict__.pop("_paths", None)
        super().close()
