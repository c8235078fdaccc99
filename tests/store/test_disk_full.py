"""A full disk under the SQLite store, made with a file-size limit on the daemon process
(RLIMIT_FSIZE 0: every write that would grow a file fails with EFBIG; Python ignores
SIGXFSZ): writes answer 507 with a clear message, reads keep working, health says
`degraded`, nothing half-written is left (PRAGMA integrity_check), and once the limit is
lifted the daemon writes again by itself."""

from __future__ import annotations

import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import pgtest
from channel_fixtures import wait_for
from conftest import LLM_ENV, llm_config
from support import Daemon, agentd_env, free_port, make_home, run_cli

FULL = "insufficient storage: the disk holding the database is full; free some space and retry"

pytestmark = pytest.mark.skipif(pgtest.ENABLED, reason="the SQLite store's disk")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm):
    home = make_home(tmp_path_factory.mktemp("disk"), llm_config(fake_llm))
    d = Daemon(home, env_extra=LLM_ENV).start()
    yield d
    d.stop()


def _limit(d: Daemon, size: int) -> None:
    resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))


def test_full_disk_refuses_writes_keeps_reads_and_recovers(daemon) -> None:
    d = daemon
    agent = d.post("/api/agents", json={"manifest_toml": 'name = "filler"\nprofile = "minimal"\n'}).json()["agent_id"]
    kv = f"/api/memory/agents/{agent}/kv"
    assert d.put(f"{kv}/before", json={"value": "kept"}).status_code == 200
    assert d.post(f"/api/agents/{agent}/message", json={"message": "before"}).status_code == 200

    _limit(d, 0)
    try:
        r = d.put(f"{kv}/during", json={"value": "x" * 10000})
        assert r.status_code == 507 and r.headers["Retry-After"] == "2", r.text
        assert r.json() == {"error": FULL}
        r = d.post(f"/api/agents/{agent}/message", json={"message": "during"})
        assert r.status_code == 507 and r.json() == {"error": FULL}, r.text
        r = d.post("/v1/chat/completions", json={"model": "filler", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 507, r.text
        assert r.json() == {"error": {"message": FULL, "type": "server_error"}}
        # Reads keep working.
        assert d.get(f"{kv}/before").json()["value"] == "kept"
        assert [a["name"] for a in d.get("/api/agents").json()] == ["filler"]
        assert d.get(f"/api/agents/{agent}/session").json()["message_count"] == 2
        wait_for(lambda: d.get("/api/health").json() == {"status": "degraded"}, what="health degraded")
    finally:
        _limit(d, resource.RLIM_INFINITY)

    wait_for(lambda: d.put(f"{kv}/after", json={"value": "x" * 10000}).status_code == 200,
             what="writes accepted again")
    wait_for(lambda: d.get("/api/health").json() == {"status": "ok"}, what="health ok")
    reply = d.post(f"/api/agents/{agent}/message", json={"message": "after"})
    assert reply.status_code == 200 and reply.json()["response"] == "echo: after"
    assert d.get(f"{kv}/during").status_code == 404
    assert d.get(f"/api/agents/{agent}/session").json()["message_count"] == 4
    conn = sqlite3.connect(d.home / "data" / "agentd.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    assert "Traceback" not in d.log()


HOME_FULL = "insufficient storage: the disk holding the daemon's home is full; free some space and retry"


def test_full_disk_refuses_a_channel_configuration_and_leaves_config_toml_as_it_was(daemon) -> None:
    d = daemon
    before = (d.home / "config.toml").read_text()
    _limit(d, 0)
    try:
        r = d.post("/api/channels/telegram/configure", json={"bot_token_env": "TELEGRAM_OTHER_TOKEN"})
        assert r.status_code == 507 and r.headers["Retry-After"] == "2", r.text
        assert r.json() == {"error": HOME_FULL}
    finally:
        _limit(d, resource.RLIM_INFINITY)
    assert (d.home / "config.toml").read_text() == before
    assert not [p for p in (d.home).iterdir() if p.name.startswith(".config.toml.")]
    assert "Traceback" not in d.log()


def test_a_kill_refused_by_a_full_disk_leaves_the_agent_alive(daemon) -> None:
    d = daemon
    agent = d.post("/api/agents", json={"manifest_toml": 'name = "survivor"\nprofile = "minimal"\n'}).json()["agent_id"]
    _limit(d, 0)
    try:
        r = d.delete(f"/api/agents/{agent}")
        assert r.status_code == 507 and r.json() == {"error": FULL}, r.text
        assert d.get(f"/api/agents/{agent}").json()["name"] == "survivor"
        assert "survivor" in [a["name"] for a in d.get("/api/agents").json()]
    finally:
        _limit(d, resource.RLIM_INFINITY)
    wait_for(lambda: d.put(f"/api/memory/agents/{agent}/kv/after", json={"value": 1}).status_code == 200,
             what="writes accepted again")
    reply = d.post(f"/api/agents/{agent}/message", json={"message": "still here"})
    assert reply.status_code == 200 and reply.json()["response"] == "echo: still here"
    assert d.delete(f"/api/agents/{agent}").status_code == 200
    assert d.get(f"/api/agents/{agent}").status_code == 404
    assert "Traceback" not in d.log()


def test_a_sqlite_store_with_no_room_left_is_not_healthy(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentd.store import db as store_db
    from agentd.store import open_store

    store = open_store(tmp_path / "agentd.db")
    try:
        assert store.ping() is True
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(store_db.shutil, "disk_usage",
                            lambda _: usage._replace(free=store_db.FULL_DISK_BYTES - 1))
        assert store.ping() is False
        monkeypatch.setattr(store_db.shutil, "disk_usage", lambda _: usage._replace(free=store_db.FULL_DISK_BYTES))
        assert store.ping() is True
    finally:
        store.close()


@pytest.fixture()
def small_disk(tmp_path) -> Iterator[Path]:
    """A 32 MB tmpfs of the test's own (root only: skipped where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_really_full_disk(small_disk: Path, fake_llm) -> None:
    """ENOSPC from the file system itself, not a file-size limit: writes 507, reads work,
    health `degraded`, `agentd doctor` fails its disk check; freeing space ends it all."""
    d = Daemon(make_home(small_disk, llm_config(fake_llm)), env_extra=LLM_ENV).start()
    try:
        agent = d.post("/api/agents", json={"manifest_toml": 'name = "filler"\nprofile = "minimal"\n'}).json()["agent_id"]
        kv = f"/api/memory/agents/{agent}/kv"
        assert d.put(f"{kv}/before", json={"value": "kept"}).status_code == 200
        ballast = small_disk / "ballast"
        subprocess.run(["dd", "if=/dev/zero", f"of={ballast}", "bs=1M", "count=64"], capture_output=True)
        assert shutil.disk_usage(small_disk).free < 1024 * 1024

        r = d.put(f"{kv}/during", json={"value": "x" * 100_000})
        assert r.status_code == 507 and r.headers["Retry-After"] == "2", r.text
        assert r.json() == {"error": FULL}
        r = d.post("/api/channels/telegram/configure", json={"bot_token_env": "TELEGRAM_OTHER_TOKEN"})
        assert r.status_code == 507 and r.json() == {"error": HOME_FULL}, r.text
        assert d.get(f"{kv}/before").json()["value"] == "kept"
        assert [a["name"] for a in d.get("/api/agents").json()] == ["filler"]
        wait_for(lambda: d.get("/api/health").json() == {"status": "degraded"}, what="health degraded")
        doctor = run_cli(d.home, "doctor", port=d.port)
        assert doctor.returncode == 1
        assert re.search(r"\[fail\] disk_space +0 MB free on the disk holding .*: under 10 MB writes will "
                         r"soon answer 507; free some space", doctor.stdout), doctor.stdout

        ballast.unlink()
        wait_for(lambda: d.put(f"{kv}/after", json={"value": "x" * 100_000}).status_code == 200,
                 what="writes accepted again")
        wait_for(lambda: d.get("/api/health").json() == {"status": "ok"}, what="health ok")
        assert d.get(f"{kv}/during").status_code == 404
        assert "Traceback" not in d.log()
    finally:
        d.stop()
    conn = sqlite3.connect(d.home / "data" / "agentd.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()


def test_a_read_only_home_is_refused_at_start_with_a_clear_message(small_disk: Path) -> None:
    home = make_home(small_disk)
    Daemon(home).start().stop()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    doctor = run_cli(home, "doctor")
    assert re.search(r"\[fail\] disk_space +\S+/data is not writable: every write would answer 503", doctor.stdout), \
        doctor.stdout
    started = subprocess.run([sys.executable, "-m", "agentd", "start"], env=agentd_env(home, free_port()),
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 1
    assert started.stderr.strip().splitlines()[-1] == (
        f"error: cannot write in the home {home} (Read-only file system): agentd keeps its database, lock "
        "and logs there; make it writable (or free some space)")
    assert "Traceback" not in started.stderr


def test_a_read_only_home_not_laid_out_yet_is_refused_by_start_and_init_with_a_clear_message(
        small_disk: Path) -> None:
    bare = make_home(small_disk)
    missing = small_disk / "never-made"
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    for home in (bare, missing):
        for command in ("start", "init"):
            done = run_cli(home, command, port=free_port())
            assert done.returncode == 1, done.stdout
            assert done.stderr.strip().splitlines()[-1] == (
                f"error: cannot write in the home {home} (Read-only file system): agentd keeps its database, "
                "lock and logs there; make it writable (or free some space)")
