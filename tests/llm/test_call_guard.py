"""The call guard and its watchdog: each limit trips with its own reason, first reason wins,
the socket is interrupted, and connections of every pool (proxied too) report to the guard."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest
import requests

from agentd.llm import drivers
from agentd.llm.drivers import guard as guard_mod
from agentd.llm.drivers.guard import CallGuard, GuardedAdapter, guarded, watchdog
from agentd.llm.drivers.transport import session
from support import in_forked_child


def fresh(deadline_in: float = 5.0, idle: float | None = None) -> CallGuard:
    return CallGuard(time.monotonic() + deadline_in, idle, threading.Event())


def test_each_limit_trips_with_its_reason() -> None:
    now = time.monotonic()
    g = fresh()
    g.check(now)
    assert g.reason is None
    g.cancel.set()
    g.check(now)
    assert g.reason == "cancelled"
    late = fresh(deadline_in=-0.01)
    late.check(time.monotonic())
    assert late.reason == "timeout"
    exact = CallGuard(now, None, threading.Event())
    exact.check(now)
    assert exact.reason == "timeout", "BUG: the deadline itself is not past the deadline"


def test_idle_limit_applies_only_while_streaming() -> None:
    g = fresh(idle=1.0)
    g.check(time.monotonic() + 2)
    assert g.reason is None, "BUG: the idle limit applied before the body was streamed"
    g.streaming()
    start = g.last_byte
    assert start is not None
    g.check(start + 0.5)
    assert g.reason is None
    g.check(start + 1.0)
    assert g.reason == "idle"
    no_idle = fresh(deadline_in=1000, idle=None)
    no_idle.streaming()
    no_idle.check(time.monotonic() + 100)
    assert no_idle.reason is None


def test_bytes_keep_a_stream_alive() -> None:
    g = fresh(idle=1.0)
    g.got_bytes()
    assert g.received is True and g.last_byte is None, "BUG: bytes before streaming start the idle clock"
    g.streaming()
    first = g.last_byte
    time.sleep(0.02)
    g.got_bytes()
    assert g.last_byte is not None and first is not None and g.last_byte > first


def test_first_reason_wins_and_trip_interrupts_the_socket() -> None:
    a, b = socket.socketpair()
    try:
        g = fresh()
        g.attach(a)
        g.trip("cancelled")
        g.trip("timeout")
        g.cancel.set()
        g.check(time.monotonic() + 100)
        assert g.reason == "cancelled"
        assert a.recv(10) == b"", "BUG: tripping the guard does not shut the socket down"
    finally:
        a.close()
        b.close()


def test_attaching_to_a_tripped_guard_interrupts_at_once() -> None:
    a, b = socket.socketpair()
    try:
        g = fresh()
        g.trip("timeout")
        g.attach(a)
        assert a.recv(10) == b""
        g.attach(None)   # a connection without a socket yet is ignored
    finally:
        a.close()
        b.close()


def test_every_pool_reports_its_connections() -> None:
    adapter = GuardedAdapter()
    assert adapter.poolmanager.pool_classes_by_scheme == {"http": guard_mod._Pool, "https": guard_mod._SPool}
    proxied = adapter.proxy_manager_for("http://127.0.0.1:3128")
    assert proxied.pool_classes_by_scheme == {"http": guard_mod._Pool, "https": guard_mod._SPool}, \
        "BUG: calls through an HTTP proxy cannot be interrupted"
    pickled = GuardedAdapter.__new__(GuardedAdapter)
    pickled.init_poolmanager(4, 8, block=False)
    assert pickled.poolmanager.connection_pool_kw["maxsize"] == 8 and \
        pickled.poolmanager.pool_classes_by_scheme["http"] is guard_mod._Pool


class _Slow(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        time.sleep(5)


def test_a_request_registers_its_socket_and_the_watchdog_ends_it() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        g = fresh(deadline_in=0.3)
        assert drivers.active_calls() == 0
        started = time.monotonic()
        with guarded(g):
            assert drivers.active_calls() == 1
            with pytest.raises(Exception):
                session().get(f"http://127.0.0.1:{server.server_port}/", timeout=10)
        assert g.sent is True and g.reused is False and g.reason == "timeout"
        assert time.monotonic() - started < 3, "BUG: the watchdog did not interrupt a hung request"
        assert drivers.active_calls() == 0
    finally:
        server.shutdown()


def test_the_watchdog_is_one_daemon_thread_and_forked_children_start_their_own() -> None:
    dog = watchdog()
    assert dog is watchdog() and dog._thread.daemon and dog._thread.name == "agentd-llm-watchdog"

    def child_has_its_own() -> bool:
        child = watchdog()
        return child is not dog and child._thread.is_alive()

    assert in_forked_child(child_has_its_own), "BUG: a forked child reuses a watchdog whose thread it does not have"


def test_a_fresh_guard_has_seen_nothing_and_leaves_no_trace() -> None:
    g = fresh()
    assert (g.sent, g.reused, g.received, g.reason, g.last_byte) == (False, False, False, None, None)
    assert g.sent is False and g.reused is False and g.received is False
    seen: list = []
    t = threading.Thread(target=lambda: seen.append(guard_mod.current_guard()))
    t.start()
    t.join()
    assert seen == [None], "BUG: a thread that never entered a guard has one"
    with guarded(g):
        assert guard_mod.current_guard() is g
    assert guard_mod.current_guard() is None, "BUG: a finished call leaves its guard on the thread"


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep the connection open between requests
    seen: list = []

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def _keepalive_server():
    _KeepAlive.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_kept_alive_connection_is_reported_as_reused() -> None:
    server = _keepalive_server()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        results = []

        def calls() -> None:  # a thread of its own: a fresh session, so the first connection is new
            for path in ("/one", "/two"):
                g = fresh()
                with guarded(g):
                    session().post(url + path, data=b"x", timeout=5).close()
                results.append((g.sent, g.reused))

        t = threading.Thread(target=calls)
        t.start()
        t.join(10)
        assert results == [(True, False), (True, True)], \
            "BUG: a request on a kept-alive connection is not marked as reused (or a new one is)"
        assert _KeepAlive.seen == ["/one", "/two"]
    finally:
        server.shutdown()


def test_a_call_cancelled_before_sending_never_reaches_the_provider() -> None:
    """On a kept-alive connection the socket exists before the request is written: a guard
    that already tripped shuts it down first, so the provider never sees the request."""
    server = _keepalive_server()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        outcome: list = []

        def calls() -> None:
            with guarded(fresh()):
                session().post(url + "/first", data=b"x", timeout=5).close()
            late = fresh()
            late.trip("cancelled")
            with guarded(late):
                try:
                    session().post(url + "/cancelled", data=b"x", timeout=5).close()
                    outcome.append("answered")
                except Exception:  # noqa: BLE001 - the interrupted send fails in urllib3 or requests
                    outcome.append("failed")
            outcome.append(late.sent)

        t = threading.Thread(target=calls)
        t.start()
        t.join(10)
        time.sleep(0.2)  # let the server handle whatever reached it
        assert outcome == ["failed", False] and _KeepAlive.seen == ["/first"], \
            "BUG: a cancelled call was still sent on a kept-alive connection"
    finally:
        server.shutdown()


def test_the_watchdog_sleeps_until_a_call_starts_even_after_a_stale_wake() -> None:
    dog = guard_mod._Watchdog.__new__(guard_mod._Watchdog)
    dog._guards, dog._lock, dog._wake = set(), threading.Lock(), threading.Event()
    dog._wake.set()  # left over from an earlier call that has ended
    t = threading.Thread(target=dog._tick, daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive(), "BUG: the idle watchdog spins instead of waiting for a call"
    g = fresh(deadline_in=-1)
    dog.add(g)
    t.join(5)
    assert not t.is_alive() and g.reason is None  # woken; the guard is checked on the next pass
    dog._tick()
    assert g.reason == "timeout" and dog.active() == 1
    dog.remove(g)
    assert dog.active() == 0


def test_no_calls_are_counted_before_the_watchdog_exists() -> None:
    assert in_forked_child(lambda: guard_mod._watchdog is None and drivers.active_calls() == 0), \
        "BUG: calls counted in a process that made none"


def test_interrupting_a_closed_socket_is_harmless() -> None:
    a, b = socket.socketpair()
    g = fresh()
    g.attach(a)
    a.close()
    b.close()
    g.trip("cancelled")  # shutdown on a closed socket raises OSError inside: swallowed
    assert g.reason == "cancelled"


def test_a_new_watchdog_runs_its_own_daemon_thread_and_enforces_deadlines() -> None:
    dog = guard_mod._Watchdog()   # not the shared one: this test covers its construction
    assert dog._thread.is_alive() and dog._thread.daemon is True and dog._thread.name == "agentd-llm-watchdog", \
        "BUG: the watchdog thread is not a named daemon thread"
    g = fresh(deadline_in=0.1)
    dog.add(g)
    waited = time.monotonic()
    while g.reason is None and time.monotonic() - waited < 10:
        time.sleep(0.02)
    dog.remove(g)
    assert g.reason == "timeout", "BUG: a new watchdog does not check its guards"


def test_forgetting_the_watchdog_starts_a_fresh_one_with_a_fresh_lock() -> None:
    old, old_lock = guard_mod.watchdog(), guard_mod._watchdog_lock
    try:
        guard_mod._forget_watchdog()   # what a forked child runs
        assert guard_mod._watchdog is None and guard_mod.active_calls() == 0
        assert guard_mod._watchdog_lock is not old_lock and not guard_mod._watchdog_lock.locked(), \
            "BUG: a forked child keeps a lock that may have been held at fork time"
        new = guard_mod.watchdog()
        assert new is not old and new._thread.is_alive() and guard_mod.watchdog() is new
    finally:
        guard_mod._watchdog, guard_mod._watchdog_lock = old, old_lock


def test_adapter_settings_reach_the_pools() -> None:
    adapter = GuardedAdapter(pool_connections=3, pool_maxsize=5, pool_block=True)
    assert adapter.poolmanager.connection_pool_kw["block"] is True and adapter.poolmanager.connection_pool_kw[
        "maxsize"] == 5, "BUG: the adapter drops pool settings"
    proxied = adapter.proxy_manager_for("http://127.0.0.1:3129", retries=7)
    assert proxied.connection_pool_kw["retries"].total == 7 and proxied.connection_pool_kw["block"] is True


def _prepared(url: str) -> requests.PreparedRequest:
    prep = requests.PreparedRequest()
    prep.prepare(method="POST", url=url, data=b"{}")
    return prep


def _counting_lookups(adapter: GuardedAdapter) -> list[tuple]:
    """Record each pool lookup the adapter asks urllib3's pool manager for."""
    calls: list[tuple] = []
    lookup = adapter.poolmanager.connection_from_host

    def counted(*args, **kwargs):
        calls.append((args, kwargs))
        return lookup(*args, **kwargs)

    adapter.poolmanager.connection_from_host = counted
    return calls


def test_the_adapter_keeps_each_urls_pool_until_it_closes() -> None:
    adapter = GuardedAdapter()
    GuardedAdapter().close()  # closing an adapter that made no call is fine
    lookups = _counting_lookups(adapter)
    a, b = _prepared("http://127.0.0.1:9/v1/chat/completions"), _prepared("http://127.0.0.2:9/v1/messages")
    first = adapter.get_connection_with_tls_context(a, True, {}, None)
    assert adapter.get_connection_with_tls_context(a, True, {}, None) is first
    assert len(lookups) == 1, "BUG: the pool is looked up again for the same URL"
    assert (first.host, first.port) == ("127.0.0.1", 9) and isinstance(first, guard_mod._Pool)
    other = adapter.get_connection_with_tls_context(b, True, {}, None)
    assert (other.host, other.port) == ("127.0.0.2", 9), "BUG: another URL got the first URL's pool"
    secure = _prepared("https://127.0.0.1:9/v1/chat/completions")
    unverified = adapter.get_connection_with_tls_context(secure, False, {}, None)
    assert unverified.cert_reqs == "CERT_NONE", "BUG: verify=False was not passed on"
    with_cert = adapter.get_connection_with_tls_context(secure, True, {}, "/tmp/client.pem")
    assert with_cert is not unverified and with_cert.cert_file == "/tmp/client.pem"
    assert adapter.get_connection_with_tls_context(secure, False, {}, None) is unverified
    assert len(lookups) == 4
    adapter.close()
    after = adapter.get_connection_with_tls_context(a, True, {}, None)
    assert len(lookups) == 5 and after.host == "127.0.0.1", "BUG: a closed adapter kept its pools"
    proxied = adapter.get_connection_with_tls_context(a, True, {"http": "http://127.0.0.1:3128"}, None)
    assert proxied.host == "127.0.0.1" and proxied.port == 3128, "BUG: a proxied call skipped its proxy"
    proxied_tls = adapter.get_connection_with_tls_context(secure, False, {"https": "http://127.0.0.1:3128"},
                                                          "/tmp/client.pem")
    assert proxied_tls.cert_reqs == "CERT_NONE" and proxied_tls.cert_file == "/tmp/client.pem", \
        "BUG: a proxied call lost its certificate settings"


def test_the_pool_cache_is_bounded() -> None:
    adapter = GuardedAdapter()
    for port in range(GuardedAdapter.POOL_CACHE_SIZE + 1):
        adapter.get_connection_with_tls_context(_prepared(f"http://127.0.0.1:{port + 1}/x"), True, {}, None)
        assert len(adapter.__dict__["_pools"]) <= GuardedAdapter.POOL_CACHE_SIZE


def test_the_adapter_sends_each_urls_path_as_requests_would_parsing_it_once(monkeypatch) -> None:
    adapter = GuardedAdapter()
    parsed: list[str] = []
    stock = requests.adapters.HTTPAdapter.request_url

    def counted(self, request, proxies):
        parsed.append(request.url)
        return stock(self, request, proxies)

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "request_url", counted)
    a = _prepared("http://127.0.0.1:9/v1/chat/completions?key=1#frag")
    b = _prepared("http://127.0.0.1:9/v1beta/models/x:generateContent")
    assert adapter.request_url(a, {}) == "/v1/chat/completions?key=1"
    assert adapter.request_url(a, {}) == "/v1/chat/completions?key=1"
    assert adapter.request_url(b, None) == "/v1beta/models/x:generateContent"
    assert parsed == [a.url, b.url], "BUG: a URL's path is parsed again on every call"
    # Through a plain-http proxy the whole URL is sent, every time, whatever was cached.
    proxy = {"http": "http://127.0.0.1:3128"}
    assert adapter.request_url(a, proxy) == "http://127.0.0.1:9/v1/chat/completions?key=1"
    assert adapter.request_url(a, proxy) == "http://127.0.0.1:9/v1/chat/completions?key=1"
    assert len(parsed) == 4
    adapter.close()
    assert adapter.request_url(a, {}) == "/v1/chat/completions?key=1" and len(parsed) == 5, \
        "BUG: a closed adapter kept its parsed paths"
    for port in range(GuardedAdapter.POOL_CACHE_SIZE + 1):
        adapter.request_url(_prepared(f"http://127.0.0.1:{port + 1}/x"), {})
        assert len(adapter.__dict__["_paths"]) <= GuardedAdapter.POOL_CACHE_SIZE
    assert adapter.request_url(_prepared("http://127.0.0.1:1/x"), {}) == "/x"


class _Answers(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def date_time_string(self, timestamp=None) -> str:
        # A fixed Date: the two answers compared below may fall either side of a second.
        return "Sat, 28 Nov 2026 04:58:52 GMT"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b"caf\xe9"
        self.send_response(201, "Made")
        self.send_header("Content-Type", "text/plain; charset=latin-1")
        self.send_header("Content-Length", str(len(body)))
        if self.path == "/cookie":
            self.send_header("Set-Cookie", "session=abc; Path=/")
        if self.path == "/cookie2":
            self.send_header("Set-Cookie2", 'old="1"; Version="1"')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("path", ["/plain", "/cookie", "/cookie2"])
def test_the_adapter_builds_the_response_requests_builds(path: str, monkeypatch) -> None:
    extracted: list[str] = []
    extract = requests.adapters.extract_cookies_to_jar
    monkeypatch.setattr(requests.adapters, "extract_cookies_to_jar",
                        lambda jar, req, resp: extracted.append(req.url) or extract(jar, req, resp))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    try:
        answers = []
        for adapter in (GuardedAdapter(), requests.adapters.HTTPAdapter()):
            prep = requests.PreparedRequest()
            prep.prepare(method="GET", url=url)
            response = adapter.send(prep, timeout=5)
            answers.append(response)
            assert response.connection is adapter and response.request is prep
        mine, stock = answers
        # The cookie jar is asked only about an answer that sets a cookie (and by requests' own adapter).
        assert len(extracted) == (1 if path == "/plain" else 2), extracted
        for name in ("status_code", "reason", "url", "encoding", "text", "content"):
            assert getattr(mine, name) == getattr(stock, name), name
        assert dict(mine.headers) == dict(stock.headers) and mine.headers["content-type"]
        assert mine.cookies.get_dict() == stock.cookies.get_dict() == (
            {"session": "abc"} if path == "/cookie" else {})
        assert mine.raw.status == 201 and mine.encoding == "latin-1" and mine.text == "café"
    finally:
        server.shutdown()
        server.server_close()
