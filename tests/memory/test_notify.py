"""agentd/memory/notify.py in process: MemoryNotifier objects with different daemon ids on one
real PostgreSQL database stand for daemons sharing it (a temp cluster, tests/pgtest.py; skipped
when PostgreSQL is not installed). Exact payloads on the channel, who is told, reconnects after
a dropped connection (then every matrix is dropped), a server that cannot be reached, and the
lone daemon on SQLite (nothing sent, nobody listens)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from agentd.memory import notify
from agentd.memory.notify import MemoryNotifier
from agentd.store.outage import OUTAGE
from agentd.store import open_store
from support import wait_until

WAIT = 20.0




@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    import pgtest
    from agentd.store.backend import parse_database_url

    if pgtest.pg_bindir() is None and not os.environ.get("AGENTD_TEST_DATABASE_URL"):
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    url = pgtest.databases().new_url()
    store = open_store(tmp_path_factory.mktemp("notify") / "agentd.db",
                       parse_database_url(url, "test", allow_password=True))
    yield SimpleNamespace(store=store, url=url)
    store.close()


class Seen:
    """An `invalidate` callback that records what it was called with."""

    def __init__(self) -> None:
        self.calls: list[str | None] = []

    def __call__(self, agent_id: str | None) -> None:
        self.calls.append(agent_id)


@pytest.fixture()
def pair(pg):
    """Two started notifiers ("A" and "B") on one database, both listening."""
    seen_a, seen_b = Seen(), Seen()
    a = MemoryNotifier(pg.store, "A", seen_a)
    b = MemoryNotifier(pg.store, "B", seen_b)
    a.start()
    b.start()
    try:
        assert a.listening.wait(WAIT) and b.listening.wait(WAIT)
        yield SimpleNamespace(a=a, b=b, seen_a=seen_a, seen_b=seen_b)
    finally:
        a.close()
        b.close()


def raw_listener(url: str):
    import psycopg2

    conn = psycopg2.connect(url)
    conn.autocommit = True
    conn.cursor().execute("LISTEN agentd_memory")
    return conn


def notify_raw(url: str, payload: str) -> None:
    import psycopg2

    conn = psycopg2.connect(url)
    try:
        conn.autocommit = True
        conn.cursor().execute("SELECT pg_notify('agentd_memory', %s)", (payload,))
    finally:
        conn.close()


def test_constants() -> None:
    assert notify.CHANNEL == "agentd_memory"
    assert notify.RECONNECT_SECS == 1.0


def test_fresh_notifier_state(pg) -> None:
    seen = Seen()
    n = MemoryNotifier(pg.store, "D1", seen)
    assert n.store is pg.store and n.daemon_id == "D1" and n.invalidate is seen
    assert n.enabled is True
    assert n._thread is None and n._conn is None
    assert n.received == 0
    assert not n.listening.is_set()
    n.close()  # never started: nothing to join or close
    assert seen.calls == []


def test_publish_sends_daemon_and_agent_on_the_channel(pg) -> None:
    conn = raw_listener(pg.url)
    try:
        MemoryNotifier(pg.store, "daemon-1", Seen()).publish("agent-7")
        deadline = time.monotonic() + WAIT
        while not conn.notifies and time.monotonic() < deadline:
            conn.poll()
            time.sleep(0.02)
        assert [(n.channel, n.payload) for n in conn.notifies] == [("agentd_memory", "daemon-1|agent-7")]
    finally:
        conn.close()


def test_the_other_daemon_drops_the_agent_and_the_sender_does_not(pair) -> None:
    pair.a.publish("agent-1")
    wait_until(lambda: pair.seen_b.calls, "B told of A's write")
    pair.b.publish("agent-2")
    wait_until(lambda: pair.seen_a.calls, "A told of B's write")
    time.sleep(0.3)  # a notification of one's own would have arrived by now as well
    assert pair.seen_b.calls == ["agent-1"], "BUG: a daemon must be told exactly the agent the other one changed"
    assert pair.seen_a.calls == ["agent-2"], "BUG: a daemon drops matrices on its own notifications"
    assert (pair.a.received, pair.b.received) == (1, 1)


def test_several_notifications_at_once_all_arrive_in_order(pair) -> None:
    for agent in ("x1", "x2", "x3"):
        pair.a.publish(agent)
    wait_until(lambda: len(pair.seen_b.calls) >= 3, "three notifications")
    assert pair.seen_b.calls == ["x1", "x2", "x3"]
    assert pair.b.received == 3


def test_payloads_without_agent_or_from_itself_are_ignored(pg, pair) -> None:
    notify_raw(pg.url, "A|")          # no agent id
    notify_raw(pg.url, "A")           # no separator at all
    notify_raw(pg.url, "B|from-b")    # B's own
    notify_raw(pg.url, "A|a|b")       # the agent id is everything after the first "|"
    notify_raw(pg.url, "AB|c")        # a daemon id that extends B's is another daemon
    notify_raw(pg.url, "|d")          # an empty sender is not B
    notify_raw(pg.url, "Z|last")
    wait_until(lambda: "last" in pair.seen_b.calls and "last" in pair.seen_a.calls, "the last notification")
    assert pair.seen_b.calls == ["a|b", "c", "d", "last"]
    assert pair.b.received == 4
    assert pair.seen_a.calls == ["from-b", "c", "d", "last"], "BUG: A must ignore its own payloads, also 'A|a|b'"
    assert pair.a.received == 4


def test_a_dropped_connection_reconnects_and_drops_every_matrix(pg, pair, caplog) -> None:
    import psycopg2

    assert pair.seen_b.calls == [], "BUG: the first connect must not drop matrices"
    old = pair.b._conn
    pid = old.get_backend_pid()
    admin = psycopg2.connect(pg.url)
    try:
        admin.autocommit = True
        with caplog.at_level(logging.DEBUG, logger="agentd.memory.notify"):
            admin.cursor().execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_until(lambda: pair.seen_b.calls == [None], "the drop of every matrix")
            wait_until(lambda: pair.b.listening.is_set() and pair.b._conn is not None
                     and pair.b._conn is not old, "the new LISTEN")
    finally:
        admin.close()
    assert old.closed, "BUG: the lost connection is not closed"
    lost = [r for r in caplog.records if r.getMessage().startswith("memory listener lost its connection: ")]
    # A killed connection is the database's outage, logged once by the store: a debug line here.
    assert len(lost) == 1 and lost[0].levelno == logging.DEBUG
    assert "terminat" in lost[0].getMessage(), "BUG: the warning must say why: " + lost[0].getMessage()
    assert pair.b._conn.autocommit is True
    # notifications reach the new connection
    pair.a.publish("after")
    wait_until(lambda: "after" in pair.seen_b.calls, "a notification after the reconnect")
    assert pair.seen_b.calls == [None, "after"]
    assert pair.b.received == 1, "BUG: the reconnect's drop-all is not a received notification"
    assert pair.seen_a.calls == [], "BUG: only the reconnected listener drops its matrices"


def test_close_stops_the_listener_and_closes_its_connection(pg, caplog) -> None:
    n = MemoryNotifier(pg.store, "C", Seen())
    n.start()
    assert n.listening.wait(WAIT)
    thread, conn = n._thread, n._conn
    assert thread.name == "agentd-memory-listen" and thread.daemon is True
    with caplog.at_level(logging.WARNING, logger="agentd.memory.notify"):
        n.close()
    assert not thread.is_alive()
    assert conn.closed
    assert n._conn is None and not n.listening.is_set()
    assert [r.getMessage() for r in caplog.records] == [], "BUG: a closing listener logs a lost connection"


def test_an_idle_listener_keeps_its_connection(pair) -> None:
    conn = pair.b._conn
    time.sleep(2.5)  # more than two idle polls of the connection
    assert pair.b._conn is conn and pair.b.listening.is_set()
    assert pair.seen_b.calls == [], "BUG: an idle second ends the pump (reconnect, drop of every matrix)"
    pair.a.publish("still")
    wait_until(lambda: pair.seen_b.calls, "a notification after idle seconds")
    assert pair.seen_b.calls == ["still"] and pair.b._conn is conn


def test_stop_ends_the_pump_even_while_the_connection_stays_open(pg) -> None:
    n = MemoryNotifier(pg.store, "G", Seen())
    n.start()
    assert n.listening.wait(WAIT)
    conn = n._conn
    n._stop.set()  # the stop flag alone (close() also closes the connection): checked every second
    n._thread.join(WAIT)
    try:
        assert not n._thread.is_alive(), "BUG: the pump waits on its connection without a timeout"
        assert conn.closed and n._conn is None
    finally:
        n.close()


def test_close_of_a_listener_that_cannot_connect(caplog) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pool = SimpleNamespace(args=(), kwargs={"host": "127.0.0.1", "port": port, "dbname": "x", "user": "x",
                                            "connect_timeout": 2})
    store = SimpleNamespace(shared=True, db=SimpleNamespace(provider=SimpleNamespace(pool=pool)))
    seen = Seen()
    n = MemoryNotifier(store, "E", seen)  # type: ignore[arg-type]
    OUTAGE.cleared(wrote=True)  # an outage seen by an earlier test in this process is over
    try:
        with caplog.at_level(logging.DEBUG, logger="agentd.memory.notify"):
            n.start()
            wait_until(lambda: len(_records(caplog, "agentd.memory.notify")) >= 2, "two connection attempts")
            n.close()
    finally:
        OUTAGE.cleared(wrote=True)
    assert not n._thread.is_alive(), "BUG: close must end a listener waiting to reconnect"
    mine = _records(caplog, "agentd.memory.notify")
    messages = [r.getMessage() for r in mine]
    # libpq's text names the port (its wording differs between versions)
    assert all(m.startswith("memory listener cannot connect: ") and str(port) in m for m in messages), messages
    # A refused connection is the database's outage: a debug line here, one warning by the store.
    assert {r.levelno for r in mine} == {logging.DEBUG}
    store = [r.getMessage() for r in _records(caplog, "agentd.store")]
    assert len([m for m in store if m.startswith("database unavailable: ")]) == 1, store
    first, second = mine[0].created, mine[1].created
    assert second - first >= 0.9, "BUG: reconnects must wait RECONNECT_SECS"
    assert not n.listening.is_set() and seen.calls == [], "BUG: no connection, no drop of matrices"


def test_lone_daemon_sends_nothing_and_does_not_listen(tmp_path, caplog) -> None:
    store = open_store(tmp_path / "agentd.db")
    try:
        n = MemoryNotifier(store, "L", Seen())
        assert n.enabled is False
        with caplog.at_level(logging.DEBUG, logger="agentd.memory.notify"):
            n.start()
            n.publish("agent")  # pg_notify does not exist on SQLite: it must not even be tried
            n.close()
        assert n._thread is None
        assert [t.name for t in threading.enumerate() if t.name == "agentd-memory-listen"] == []
        assert caplog.records == []
    finally:
        store.close()


def test_a_failed_publish_is_logged_not_raised(tmp_path, caplog) -> None:
    store = open_store(tmp_path / "agentd.db")
    try:
        shared = dataclasses.replace(store, backend="postgres")  # "shared", but SQLite has no pg_notify
        n = MemoryNotifier(shared, "F", Seen())
        assert n.enabled is True
        with caplog.at_level(logging.DEBUG, logger="agentd.memory.notify"):
            n.publish("agent")
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == \
            [(logging.ERROR, "memory change notification failed")]
        assert caplog.records[0].exc_info is not None
    finally:
        store.close()


def _records(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]
