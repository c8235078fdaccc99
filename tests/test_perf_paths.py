"""The request path's cheaper forms behave exactly like the plain ones.

A run writes its usage rows together with its session in one transaction; these tests
pin what that must keep: the budget sees a call at once, reports see it once written,
and a message through the real daemon leaves exactly one usage row and the session.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pony import orm

from agentd.llm.catalog import Catalog
from agentd.metering import Metering
from agentd.store import open_store


@pytest.fixture()
def store(tmp_path: Path):
    s = open_store(tmp_path / "agentd.db")
    yield s
    s.close()


def _rows(store) -> int:
    with orm.db_session:
        return store.db.select("SELECT COUNT(*) FROM usage")[0]


def test_deferred_usage_counts_for_the_budget_at_once_and_is_written_by_write_rows(store) -> None:
    metering = Metering(store, Catalog.load())
    metering.set_limit(0.0026)
    pending: list[dict] = []
    # gpt-4o: 1000 input tokens * $2.50/M + 10 output * $10/M = $0.0026, the whole budget.
    cost = metering.record("a1", "alpha", "openai", "gpt-4o", 1000, 10, defer=pending)
    assert cost == pytest.approx(0.0026, abs=1e-12)
    assert len(pending) == 1 and pending[0]["agent_id"] == "a1" and pending[0]["priced"] is True
    assert _rows(store) == 0, "a deferred row must not be written before write_rows"
    with pytest.raises(Exception) as refused:
        metering.check_budget()
    assert getattr(refused.value, "status", None) == 429, "the budget must see a deferred call at once"
    store.write(lambda tx: metering.write_rows(tx, pending))
    assert _rows(store) == 1
    totals = metering.totals(*metering.period(None, None))
    assert totals["requests"] == 1 and totals["total_input_tokens"] == 1000
    assert totals["total_cost_usd"] == pytest.approx(0.0026, abs=1e-12)


def test_record_without_defer_still_writes_at_once(store) -> None:
    metering = Metering(store, Catalog.load())
    metering.record("a1", "alpha", "openai", "gpt-4o", 5, 5)
    assert _rows(store) == 1


def test_session_text_appended_per_message_is_exactly_the_sessions_json(agent_daemon) -> None:
    """Each message appends its turn as rows, one JSON text each; together they must be what
    encoding the whole session would give, survive a reset and count one usage row per call.
    The database holds them when the answer arrives (read here from outside the daemon), and
    nothing is kept beside it."""
    import json

    from support import db_rows

    d = agent_daemon
    r = d.post("/api/agents", json={"manifest_toml": 'name = "perf-session"\nprofile = "minimal"\n'})
    agent_id = r.json()["agent_id"]

    def stored() -> str:
        session_id = db_rows(d.home, "SELECT session_id FROM agents WHERE id = ?", (agent_id,))[0][0]
        bodies = db_rows(d.home, "SELECT body FROM session_messages WHERE session = ? ORDER BY id", (session_id,))
        return "[" + ", ".join(body for (body,) in bodies) + "]"

    def usage_rows() -> int:
        return db_rows(d.home, "SELECT COUNT(*) FROM usage WHERE agent_id = ?", (agent_id,))[0][0]

    for i, text in enumerate(["first", 'second "quoted" é', "third"], start=1):
        assert d.post(f"/api/agents/{agent_id}/message", json={"message": text}).status_code == 200
        raw = stored()
        messages = json.loads(raw)
        assert raw == json.dumps(messages, ensure_ascii=False)
        assert [m["content"] for m in messages if m["role"] == "user"] == ["first", 'second "quoted" é', "third"][:i]
        assert len(messages) == 2 * i and usage_rows() == i
    assert d.post(f"/api/agents/{agent_id}/session/reset").status_code == 200
    assert d.post(f"/api/agents/{agent_id}/message", json={"message": "after reset"}).status_code == 200
    messages = json.loads(stored())
    assert [m["content"] for m in messages if m["role"] == "user"] == ["after reset"]
    session = d.get(f"/api/agents/{agent_id}/session").json()
    assert session["message_count"] == 2 and session["messages"][0]["content"] == "after reset"
    assert sorted(p.name for p in (d.home / "data").iterdir() if "messages" in p.name) == []


def test_per_message_ids_are_version_4_uuids_and_do_not_repeat() -> None:
    import uuid

    from agentd.ids import random_uuid

    ids = [random_uuid() for _ in range(2000)]
    assert all(isinstance(u, uuid.UUID) and u.version == 4 and u.variant == uuid.RFC_4122 for u in ids)
    assert len(set(ids)) == 2000


def test_request_ids_as_text_are_version_4_uuids_with_random_bits_everywhere_else() -> None:
    import uuid

    from agentd.ids import random_uuid_hex, random_uuid_str

    hexes = [random_uuid_hex() for _ in range(2000)]
    texts = [random_uuid_str() for _ in range(2000)]
    parsed = [uuid.UUID(hex=h) for h in hexes] + [uuid.UUID(t) for t in texts]
    assert all(len(h) == 32 and h == h.lower() for h in hexes)
    assert all(str(u) == t for u, t in zip(parsed[2000:], texts))
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in parsed)
    assert len({u.int for u in parsed}) == 4000
    # Only the six version and variant bits are fixed: every other bit is seen both ways.
    fixed = 0xF000 << 64 | 0xC000 << 48
    ones = zeros = 0
    for u in parsed:
        ones |= u.int
        zeros |= ~u.int & ((1 << 128) - 1)
    assert ones & zeros == ((1 << 128) - 1) & ~fixed


def test_run_ids_are_version_7_uuids_in_time_order() -> None:
    import time
    import uuid

    from agentd.ids import time_ordered_uuid, time_ordered_uuid_str

    before = time.time_ns() // 1_000_000
    ids = []
    for _ in range(3):
        ids += [time_ordered_uuid() for _ in range(500)]
        ids += [uuid.UUID(text) for text in (time_ordered_uuid_str() for _ in range(500))]
        time.sleep(0.003)  # later milliseconds sort after
    after = time.time_ns() // 1_000_000
    text = time_ordered_uuid_str()
    assert str(uuid.UUID(text)) == text
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    assert len(set(ids)) == 3000
    stamps = [u.int >> 80 for u in ids]
    assert before <= stamps[0] and stamps == sorted(stamps) and stamps[-1] <= after
    assert stamps[1000] > stamps[999] and stamps[2000] > stamps[1999]
    # The bits after the time are random: no two ids share them, and the 12 between the
    # version and the variant take (nearly) every value, odd and even alike.
    assert len({u.int & ((1 << 80) - 1) for u in ids}) == 3000
    rand_a = [(u.int >> 64) & 0xFFF for u in ids]
    assert len(set(rand_a)) > 1500 and {r & 1 for r in rand_a} == {0, 1}


def test_flask_is_asked_once_per_hook_whether_it_is_a_coroutine(tmp_path: Path, monkeypatch) -> None:
    """The app's ensure_sync caches Flask's answer: same callable back, one inspection each."""
    import flask

    from agentd.api import create_app
    from agentd.config import load_config
    from agentd.kernel import Kernel

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("AGENTD_HOME", str(home))
    kernel = Kernel(load_config(home), open_store(home / "agentd.db"))
    try:
        app = create_app(kernel)
        asked: list = []
        real = flask.Flask.ensure_sync
        monkeypatch.setattr(flask.Flask, "ensure_sync", lambda self, f: asked.append(f) or real(self, f))

        def view() -> str:
            return "x"

        assert app.ensure_sync(view) is view and app.ensure_sync(view) is view
        assert asked == [view]
        with app.test_client() as client:
            for _ in range(3):
                assert client.get("/api/health").status_code == 200
        assert len(asked) == len(set(asked)), "BUG: Flask asked again about a hook it had answered"
    finally:
        kernel.close()


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    import os

    from agentd.ids import random_uuid

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.close(read)
        os.write(write, random_uuid().hex.encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32 and child != random_uuid().hex


def test_the_daemon_tunes_the_collector_and_switch_interval() -> None:
    import gc
    import sys

    from agentd.daemon import GC_THRESHOLD, SWITCH_INTERVAL, tune_interpreter

    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.001)  # (not the value it sets: the test sees it set)
        tune_interpreter(0, 0)
        assert gc.get_threshold() == GC_THRESHOLD == (7000, 10, 10)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL) and SWITCH_INTERVAL == 0.005
    finally:
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)


def test_boot_freezes_what_it_built(tmp_path: Path) -> None:
    """After the boot thread opened the kernel and app, those objects are out of the
    collector's sight (gc.freeze), and the collector never ran in that thread meanwhile (it
    runs again once the boot is done); the kernel stops this daemon on POST /api/shutdown, the
    app reports this server's pool, and the ready line tells how long the boot took (here
    stretched by AGENTD_TEST_BOOT_DELAY). The daemon starts in a child process: its 128
    server threads, background threads and frozen heap stay out of the test worker."""
    import os
    import subprocess
    import sys

    from support import free_port

    home = tmp_path / "home"
    home.mkdir()
    script = (
        "import gc, logging, sys, threading\n"
        "logging.basicConfig(stream=sys.stderr, level=logging.INFO, format='%(message)s')\n"
        "in_boot = []\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and threading.current_thread().name == "
        "'agentd-boot' and in_boot.append(info['generation']))\n"
        "from agentd.config import load_config\n"
        "from agentd.daemon import Daemon\n"
        "daemon = Daemon(load_config())\n"
        "daemon.start()\n"
        "daemon._boot_thread.join(60)\n"
        "k = daemon.kernel\n"
        "print(k is not None, daemon._boot_error, gc.get_freeze_count(),\n"
        "      k._shutdown_hook == daemon.request_stop,\n"
        "      daemon.server.application.extensions['agentd.pool_stats']() == daemon._pool_stats(),\n"
        "      len(in_boot), gc.isenabled(), flush=True)\n"
        "daemon.request_stop()\n"
        "daemon._drain()\n"
        "daemon.release_home()\n"
    )
    env = {**os.environ, "AGENTD_HOME": str(home), "AGENTD_LISTEN": f"127.0.0.1:{free_port()}",
           "AGENTD_TEST_BOOT_DELAY": "0.4"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    booted, error, frozen, stops_daemon, reports_pool, boot_collections, collecting = done.stdout.split()
    assert booted == "True" and error == "None"
    assert int(frozen) > 1000
    assert (boot_collections, collecting) == ("0", "True")
    assert stops_daemon == "True" and reports_pool == "True"
    took = re.search(r"^agentd ready \(kernel and app loaded in (\d+\.\d\d)s\)$", done.stderr, re.M)
    assert took is not None, done.stderr
    assert 0.4 <= float(took.group(1)) < 60
