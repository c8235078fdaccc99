"""agentd/daemon.py in process: what a start refuses or cleans up before it listens (a live
daemon, a stale or unreadable daemon.json, a held or unwritable home), the store it opens,
the interpreter settings, and a whole start, boot and stop of a `Daemon` on a free port."""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest
import requests
from werkzeug.test import Client

from agentd import daemon as daemon_module
from agentd.cli.client import DaemonInfo, process_identity, write_daemon_file
from agentd.config import parse_config
from agentd.daemon import Daemon, StartError, check_not_running, lock_home, open_daemon_store, tune_interpreter
from agentd.store.backend import parse_database_url
import pgtest
from support import free_port, with_test_db


def config_for(home: Path, **extra):
    data = {"memory": {"auto_remember": False}, "api_listen": f"127.0.0.1:{free_port()}", **extra}
    return parse_config(with_test_db(data, home), home)


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"status": "ok"}'
        self.send_response(200 if self.path == "/api/health" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def live_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# -- before the start listens --------------------------------------------------------------------------------------

def test_no_daemon_file_lets_the_start_go_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(tmp_path)
    with caplog.at_level(logging.WARNING, logger="agentd.daemon"):
        check_not_running(config)
    assert caplog.records == [] and not config.daemon_file.exists()


def test_an_unreadable_daemon_file_is_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(tmp_path)
    config.daemon_file.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="agentd.daemon"):
        check_not_running(config)
    assert not config.daemon_file.exists()
    assert [r.getMessage() for r in caplog.records] == [f"removing unreadable {config.daemon_file}"]


def test_a_daemon_file_of_a_daemon_that_does_not_answer_is_removed(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(tmp_path)
    write_daemon_file(config.daemon_file, DaemonInfo(f"127.0.0.1:{free_port()}", 4242, "2026-01-01T00:00:00Z"))
    with caplog.at_level(logging.WARNING, logger="agentd.daemon"):
        check_not_running(config)
    assert not config.daemon_file.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"removing stale {config.daemon_file} (pid 4242 is not answering)"]


def test_a_live_daemon_refuses_the_start(tmp_path: Path, live_server: ThreadingHTTPServer) -> None:
    config = config_for(tmp_path)
    port = live_server.server_address[1]
    write_daemon_file(config.daemon_file, DaemonInfo(f"127.0.0.1:{port}", 4242, "2026-01-01T00:00:00Z"))
    with pytest.raises(StartError) as refused:
        check_not_running(config)
    assert refused.value.message == f"agentd is already running at http://127.0.0.1:{port} (pid 4242)"
    assert config.daemon_file.exists()


def test_the_home_lock_is_held_once(tmp_path: Path) -> None:
    home = tmp_path / "new" / "home"
    config = config_for(home)
    held = lock_home(config)
    try:
        assert (home / "daemon.lock").is_file()
        with pytest.raises(StartError) as refused:
            lock_home(config)
        assert refused.value.message == (f"another agentd is starting or running with home {home} "
                                         f"(it holds {home / 'daemon.lock'})")
    finally:
        held.close()
    lock_home(config).close()   # released: the next start takes it


def test_a_home_that_cannot_be_written_refuses_the_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    home = tmp_path / "file" / "home"
    config = config_for(tmp_path)
    config.home = home
    with pytest.raises(StartError) as refused:
        lock_home(config)
    assert refused.value.message == (
        f"cannot write in the home {home} (Not a directory): agentd keeps its database, lock and logs "
        "there; make it writable (or free some space)")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_store_is_opened_in_a_new_home(tmp_path: Path, backend: str, caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "a" / "b"
    config = parse_config({"memory": {"auto_remember": False}}, home)
    if backend == "postgres":
        # Explicitly: this file runs in the suite's SQLite pass only, as mutation runs do.
        url = pgtest.databases().new_url().replace("postgres@", "postgres:hidden@", 1)
        config.database = parse_database_url(url, "test", allow_password=True)
    with caplog.at_level(logging.INFO, logger="agentd.daemon"):
        store = open_daemon_store(config)
    try:
        assert home.is_dir() and store.ping() and store.backend == backend
        named = [r.getMessage() for r in caplog.records if r.name == "agentd.daemon"]
        if backend == "sqlite":
            assert named == [] and config.db_path.exists()
        else:
            masked = url.replace(":hidden@", ":***@", 1)
            assert named == [f"database: postgres {masked}"] and not config.db_path.exists()
    finally:
        store.close()


def test_the_interpreter_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[tuple[int, int]] = []
    monkeypatch.setattr(daemon_module, "tune_malloc", lambda arenas, threshold: applied.append((arenas, threshold)))
    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    try:
        tune_interpreter(3, 512)
        assert applied == [(3, 512)]
        assert sys.getswitchinterval() == pytest.approx(0.005)
        assert gc.get_threshold() == (7000, 10, 10)
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*threshold)


# -- a start, boot and stop ----------------------------------------------------------------------------------------

def test_a_daemon_starts_boots_serves_and_stops(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The server loop runs in this (the main) thread, where signal handlers go; a client
    thread asks what a user would, then for the stop."""
    config = config_for(tmp_path / "home", cluster={"daemon_id": "in-process"})
    daemon = Daemon(config)
    with caplog.at_level(logging.INFO, logger="agentd.daemon"):
        daemon.start()
    base = f"http://{config.api_listen}"
    # The gate answers the probe during the boot naming the daemon, as the app does after it.
    assert daemon.gate.extra_headers == [("X-Agentd-Daemon", "in-process")]
    # A boot that hangs does not keep the process from exiting.
    assert (daemon._boot_thread.name, daemon._boot_thread.daemon) == ("agentd-boot", True)
    seen: dict = {}

    def client() -> None:
        try:
            seen["detail"] = requests.get(f"{base}/api/health/detail", timeout=20)
            seen["pool"] = daemon._pool_stats()
        finally:
            seen["shutdown"] = requests.post(f"{base}/api/shutdown", timeout=10).json()

    try:
        info = json.loads(config.daemon_file.read_text())
        assert (info["listen_addr"], info["pid"], info["process"]) == (
            config.api_listen, os.getpid(), process_identity(os.getpid()))
        with pytest.raises(StartError):
            lock_home(config)   # the running daemon holds its home
        asker = threading.Thread(target=client)
        asker.start()
        with caplog.at_level(logging.INFO, logger="agentd.daemon"):
            daemon.serve()   # returns once the client's stop is done
        asker.join(10)
    finally:
        daemon.release_home()
        gc.unfreeze()   # what the boot froze is this test process's
    detail = seen["detail"]
    assert detail.status_code == 200 and detail.headers["X-Agentd-Daemon"] == daemon.kernel.cluster.id
    assert detail.json()["thread_pool"]["threads"] == seen["pool"]["threads"] == config.api.threads
    assert seen["shutdown"] == {"status": "shutting_down"}
    assert not config.daemon_file.exists()
    lock_home(config).close()
    said = [r.getMessage() for r in caplog.records if r.name == "agentd.daemon"]
    assert said[0] == f"agentd listening on http://{config.api_listen} (home {config.home})"
    ready = re.fullmatch(r"agentd ready \(kernel and app loaded in (\d+\.\d\d)s\)", said[1])
    assert ready and 0 < float(ready[1]) < 60, said
    assert said[-1] == "agentd stopped"


def test_a_boot_that_fails_ends_the_start_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTD_TEST_BOOT_DELAY", "soon")   # not a number: the boot fails
    config = config_for(tmp_path / "home")
    daemon = Daemon(config)
    daemon.start()
    closed: list[bool] = []
    close_store = daemon._store.close
    monkeypatch.setattr(daemon._store, "close", lambda: closed.append(True) or close_store())
    try:
        with pytest.raises(StartError) as failed:
            daemon.serve()
    finally:
        daemon.release_home()
    why = "agentd failed to start: could not convert string to float: 'soon'"
    assert failed.value.message == why
    assert closed == [True] and not config.daemon_file.exists()
    # A request that waited for the app is told why there is none.
    answer = Client(daemon.gate).get("/api/status")
    assert (answer.status_code, answer.get_json()) == (503, {"error": why})
    daemon.release_home()   # (again: nothing left to release)
    lock_home(config).close()


def test_an_address_not_of_this_host_refuses_the_start(tmp_path: Path) -> None:
    config = config_for(tmp_path / "home", api_key="k", api_listen="192.0.2.1:8080")   # TEST-NET-1
    daemon = Daemon(config)
    try:
        with pytest.raises(StartError) as refused:
            daemon.start()
    finally:
        daemon.release_home()
    assert refused.value.message == "cannot listen on 192.0.2.1:8080: Cannot assign requested address"
    assert not config.daemon_file.exists()
    lock_home(config).close()
