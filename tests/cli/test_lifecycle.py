"""The CLI and daemon lifecycle: start, second start, stale files, stop, status, doctor, init."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from support import FAST_API, TRACEBACK, Daemon, agentd_command, agentd_env, free_port, make_home, run_cli, wait_until


def daemon_said(d: Daemon) -> list[str]:
    """The messages of the daemon's own log lines (logger agentd.daemon), in order."""
    return [line.split(" agentd.daemon: ", 1)[1] for line in d.log().splitlines() if " agentd.daemon: " in line]


def test_start_writes_daemon_file_and_sigterm_removes_it(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    d = Daemon(home).start()
    info = d.daemon_file()
    assert info["listen_addr"] == f"127.0.0.1:{d.port}"
    assert info["pid"] == d.proc.pid
    assert info["started_at"].endswith("+00:00")
    assert stat.S_IMODE((home / "daemon.json").stat().st_mode) == 0o600
    assert d.stop() == 0
    assert not (home / "daemon.json").exists()
    assert daemon_said(d)[-2:] == ["SIGTERM received: shutting down", "agentd stopped"]


def test_a_sigterm_during_the_boot_waits_for_the_kernel_then_stops_cleanly(tmp_path: Path) -> None:
    d = Daemon(make_home(tmp_path), env_extra={"AGENTD_TEST_BOOT_DELAY": "3"}).start(wait=False)

    def probed() -> bool:   # the start gate answers while the kernel still loads
        try:
            return requests.get(f"{d.url}/api/health", timeout=1).ok
        except requests.RequestException:
            return False

    wait_until(probed, "the start gate's answer", timeout=60)
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(60) == 0
    said = daemon_said(d)
    assert said[-1] == "agentd stopped" and said[-2].startswith("agentd ready"), said
    assert "SIGTERM received: shutting down" in said[:-2], "signalled during the boot"
    assert not (d.home / "daemon.json").exists()


def test_a_daemon_whose_daemon_file_was_removed_meanwhile_stops_cleanly(daemon_factory) -> None:
    d = daemon_factory()
    (d.home / "daemon.json").unlink()
    assert d.stop() == 0
    assert daemon_said(d)[-1] == "agentd stopped"


def test_sigterm_wakes_the_server_loop_at_once(tmp_path: Path) -> None:
    """The SIGTERM handler pulls the server's wake-up pipe, so the loop's poll returns now
    rather than at its timeout: a stop takes no idle wait. The handler is called as the
    signal would call it, in a daemon of a child process."""
    script = (
        "import select, signal\n"
        "from agentd.config import load_config\n"
        "from agentd.daemon import Daemon\n"
        "daemon = Daemon(load_config())\n"
        "daemon.start()\n"
        "daemon._boot_thread.join(60)\n"
        "wake = daemon.server.trigger._fds[0]\n"
        "before = select.select([wake], [], [], 0)[0]\n"
        "daemon._on_signal(signal.SIGTERM, None)\n"
        "after = select.select([wake], [], [], 0)[0]\n"
        "print(bool(before), bool(after), daemon._stop.is_set(), flush=True)\n"
        "daemon._drain()\n"
        "daemon.release_home()\n"
    )
    env = agentd_env(make_home(tmp_path), free_port())
    done = subprocess.run(agentd_command(["-c", script], env), env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"], done.stdout + done.stderr


def test_second_start_refuses(daemon_factory) -> None:
    d = daemon_factory()
    r = run_cli(d.home, "start", port=free_port())
    assert r.returncode == 1
    assert "already running" in r.stderr and str(d.port) in r.stderr
    assert d.get("/api/health").ok


def test_two_starts_at_once_on_one_home_make_one_daemon(tmp_path: Path) -> None:
    """daemon.json is written only once a daemon listens; the home lock closes that window."""
    home = make_home(tmp_path)
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([sys.executable, "-m", "agentd", "start"], env=agentd_env(home, port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for port in ports]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.1)
        refused = [p for p in procs if p.poll() is not None]
        assert len(refused) == 1 and refused[0].returncode == 1
        # Refused by the lock (both before either listened) or, had one been slower to start,
        # by the daemon.json the other had written by then.
        error = refused[0].stderr.read()
        assert "another agentd is starting or running with home" in error or "already running" in error, error
        running = next(p for p in procs if p is not refused[0])
        port = ports[procs.index(running)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/api/health", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        assert json.loads((home / "daemon.json").read_text())["pid"] == running.pid
        assert run_cli(home, "stop").returncode == 0 and running.wait(15) == 0
        # The lock went with it: the home starts again.
        again = Daemon(home).start()
        assert again.stop() == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_stale_daemon_file_is_removed(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    (home / "daemon.json").write_text(json.dumps(
        {"listen_addr": f"127.0.0.1:{free_port()}", "pid": 999999, "started_at": "2020-01-01T00:00:00+00:00"}))
    d = Daemon(home).start()
    try:
        assert d.daemon_file()["pid"] == d.proc.pid
        assert "stale" in d.log()
    finally:
        d.stop()


def test_port_in_use_fails_clearly(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        r = run_cli(home, "start", port=port)
    assert r.returncode == 1
    assert f"127.0.0.1:{port} is already in use" in r.stderr
    assert not (home / "daemon.json").exists()


def test_malformed_config_names_the_line(tmp_path: Path) -> None:
    home = make_home(tmp_path, 'log_level = "info"\n[api]\nthreads = = 3\n')
    r = run_cli(home, "start", port=free_port())
    assert r.returncode == 1
    assert "config.toml" in r.stderr and "line 3" in r.stderr
    home2 = make_home(tmp_path / "b", '[api]\nthreads = "many"\n')
    r = run_cli(home2, "start", port=free_port())
    assert r.returncode == 1 and "api.threads" in r.stderr


def test_locked_database_fails_clearly(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    (home / "data").mkdir()
    conn = sqlite3.connect(home / "data" / "agentd.db")
    conn.execute("CREATE TABLE hold (x)")
    conn.commit()
    conn.execute("BEGIN EXCLUSIVE")
    try:
        # The SQLite file is what is locked here, whatever backend the suite runs on.
        r = run_cli(home, "start", port=free_port(), env_extra={"AGENTD_DATABASE_URL": ""})
    finally:
        conn.rollback()
        conn.close()
    assert r.returncode == 1 and "locked" in r.stderr


def test_stop_command(daemon_factory) -> None:
    d = daemon_factory()
    r = run_cli(d.home, "stop", port=d.port)
    assert r.returncode == 0 and "agentd stopped" in r.stdout
    assert d.proc.wait(10) == 0
    assert not (d.home / "daemon.json").exists()


def test_stop_without_daemon(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    r = run_cli(home, "stop")
    assert r.returncode == 1 and "not running" in r.stderr


def test_stop_forces_a_hung_daemon(tmp_path: Path) -> None:
    """A daemon that never shuts down (here: stopped by SIGSTOP) is killed once the shutdown
    request (5 s) and the wait (5 s) are over, however long each look at its health could take."""
    d = Daemon(make_home(tmp_path)).start()
    d.expect_crash("killed on purpose: the test is that stop forces it")
    os.kill(d.proc.pid, signal.SIGSTOP)
    began = time.monotonic()
    r = run_cli(d.home, "stop")
    took = time.monotonic() - began
    assert r.returncode == 0 and "forced" in r.stdout
    # 10 s plus the command's own start; a whole 2 s health timeout per look would be 30 s.
    assert took < 25, f"BUG: stop waited {took:.1f}s before it forced a hung daemon"
    assert d.proc.wait(5) == -9
    assert not (d.home / "daemon.json").exists()


def test_stop_never_kills_a_process_that_is_not_agentd(tmp_path: Path) -> None:
    """A stale daemon.json whose pid now belongs to another program, and nothing answering at
    its address: the file goes, the program lives."""
    home = make_home(tmp_path)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (home / "daemon.json").write_text(json.dumps(
        {"listen_addr": f"127.0.0.1:{free_port()}", "pid": other.pid, "started_at": "x"}))
    try:
        r = run_cli(home, "stop")
        assert r.returncode == 1 and "not running (removed stale daemon.json)" in r.stderr
        assert other.poll() is None, "BUG: stop killed a process that is not agentd"
    finally:
        other.kill()
    assert not (home / "daemon.json").exists()


def test_stop_never_stops_the_daemon_of_another_home(daemon_factory, tmp_path: Path) -> None:
    """A stale daemon.json whose address another home's daemon now serves: that daemon is
    asked, refuses, and keeps running; the file goes."""
    other = daemon_factory()
    home = make_home(tmp_path / "stale")
    (home / "daemon.json").write_text(json.dumps(
        {"listen_addr": other.url.removeprefix("http://"), "pid": 999_999_999, "started_at": "x"}))
    r = run_cli(home, "stop")
    assert r.returncode == 1, r.stdout
    assert r.stderr.strip() == (f"error: agentd was not running (removed stale daemon.json): the daemon at {other.url} "
                                "serves another home")
    assert other.get("/api/health").status_code == 200 and not (home / "daemon.json").exists()
    r = other.post("/api/shutdown", params={"home": str(home)})
    assert (r.status_code, r.json()) == (409, {"error": f"this daemon serves another home: {other.home}"})
    assert other.post("/api/shutdown", params={"home": str(other.home / ".")}).json() == {"status": "shutting_down"}
    other.proc.wait(15)


def _decoy(tmp_path: Path, how: str) -> subprocess.Popen:
    """A program that is not agentd but whose command line says "agentd" (the command lines
    users really have: a tool under ~/agentd-tools/, or one that calls itself agentd)."""
    if how == "path":
        tools = tmp_path / "agentd-tools"
        tools.mkdir()
        (tools / "sleep").symlink_to(shutil.which("sleep"))
        decoy = subprocess.Popen([str(tools / "sleep"), "60"])
    else:
        decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "agentd", "start"])
    # Popen returns once exec has begun; the kernel shows the new command line a moment later.
    deadline = time.monotonic() + 10
    while b"agentd" not in Path(f"/proc/{decoy.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the decoy never showed its command line"
        time.sleep(0.01)
    return decoy


@pytest.mark.parametrize("how", ["path", "argv"])
@pytest.mark.parametrize("recorded", ["another process", "nothing"])
def test_stop_never_kills_a_decoy_named_agentd(tmp_path: Path, how: str, recorded: str) -> None:
    """A stale daemon.json names the pid of a program whose command line contains "agentd",
    and nothing answers at its address: the program lives and the file goes."""
    home = make_home(tmp_path)
    decoy = _decoy(tmp_path, how)
    try:
        stale = {"listen_addr": f"127.0.0.1:{free_port()}", "pid": decoy.pid,
                 "started_at": "2026-01-01T00:00:00+00:00"}
        if recorded == "another process":
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            stale["process"] = f"{boot}/1"
        (home / "daemon.json").write_text(json.dumps(stale))
        r = run_cli(home, "stop")
        assert (r.returncode, r.stdout) == (1, ""), r.stdout + r.stderr
        assert r.stderr == "error: agentd was not running (removed stale daemon.json)\n"
        time.sleep(0.2)
        assert decoy.poll() is None, "stop killed a process that is not agentd"
    finally:
        decoy.kill()
        decoy.wait()
    assert not (home / "daemon.json").exists()


def test_stop_signals_no_stranger_when_the_api_refuses(daemon_factory, tmp_path: Path) -> None:
    """The daemon answers but refuses the shutdown (the CLI lacks the key), and daemon.json
    names another program's pid: SIGTERM would go to that program, so none is sent."""
    d = daemon_factory(FAST_API.replace("[api]", 'api_key = "k3"\n[api]'), api_key="k3")
    config = d.home / "config.toml"
    config.write_text(config.read_text().replace('api_key = "k3"\n', ""))
    decoy = _decoy(tmp_path, "argv")
    try:
        info = json.loads((d.home / "daemon.json").read_text())
        (d.home / "daemon.json").write_text(json.dumps({**info, "pid": decoy.pid}))
        r = run_cli(d.home, "stop", env_extra={"AGENTD_API_KEY": ""})
        assert r.returncode == 1 and "nothing was killed" in r.stderr, r.stdout + r.stderr
        assert decoy.poll() is None, "stop signalled a process that is not agentd"
        assert d.get("/api/health").ok
    finally:
        decoy.kill()
        decoy.wait()


def test_stop_without_the_key_still_stops_gracefully(daemon_factory) -> None:
    """POST /api/shutdown refused (401): SIGTERM, the same graceful stop, not SIGKILL."""
    d = daemon_factory(FAST_API.replace("[api]", 'api_key = "k2"\n[api]'), api_key="k2")
    config = d.home / "config.toml"
    config.write_text(config.read_text().replace('api_key = "k2"\n', ""))  # the CLI does not know it
    r = run_cli(d.home, "stop", env_extra={"AGENTD_API_KEY": ""})
    assert r.returncode == 0 and "agentd stopped" in r.stdout and "forced" not in r.stdout, r.stdout + r.stderr
    assert d.proc.wait(10) == 0


def test_shutdown_endpoint_stops_gracefully(daemon_factory) -> None:
    d = daemon_factory()
    r = d.post("/api/shutdown")
    assert r.json() == {"status": "shutting_down"}
    assert d.proc.wait(15) == 0
    assert not (d.home / "daemon.json").exists()


def test_status_table_and_json(daemon_factory) -> None:
    d = daemon_factory()
    r = run_cli(d.home, "status")
    assert r.returncode == 0
    assert "status" in r.stdout and "running" in r.stdout and f"127.0.0.1:{d.port}" in r.stdout
    r = run_cli(d.home, "status", "--json")
    body = json.loads(r.stdout)
    assert body["status"] == "running" and body["api_listen"] == f"127.0.0.1:{d.port}"


def test_status_without_daemon(tmp_path: Path) -> None:
    r = run_cli(make_home(tmp_path), "status")
    assert r.returncode == 1 and "not running" in r.stderr


# What only the daemon needs: the web framework, the metrics, the kernel, the agents' runtime.
DAEMON_ONLY = ("flask", "werkzeug", "prometheus_client", "agentd.api", "agentd.kernel", "agentd.server.serve",
               "agentd.agents.manager")
# ...and the database layer and the HTTP client, which `agentd doctor` uses and these do not.
DATABASE_AND_HTTP = ("pony", "agentd.store", "requests")


@pytest.mark.parametrize("words, code, not_loaded", [(["--help"], 0, DAEMON_ONLY + DATABASE_AND_HTTP),
                                                     (["status"], 1, DAEMON_ONLY + DATABASE_AND_HTTP),
                                                     (["doctor"], 0, DAEMON_ONLY)])
def test_a_command_loads_only_what_it_uses(tmp_path: Path, words: list[str], code: int,
                                           not_loaded: tuple[str, ...]) -> None:
    # Every command pays for what it imports, each time it runs.
    r = run_cli(make_home(tmp_path), *words, env_extra={"PYTHONPROFILEIMPORTTIME": "1", "AGENTD_DATABASE_URL": ""})
    assert r.returncode == code, r.stdout
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", r.stderr, re.M))
    assert {"argh", "agentd.config"} <= imported, "BUG: the import log is not being read"
    assert sorted(name for name in imported if any(name == n or name.startswith(f"{n}.") for n in not_loaded)) == []


def test_cli_uses_the_api_key(daemon_factory) -> None:
    d = daemon_factory(FAST_API.replace("[api]", 'api_key = "k1"\n[api]'), api_key="k1")
    assert requests.get(f"{d.url}/api/status").status_code == 401
    r = run_cli(d.home, "status", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "running"
    r = run_cli(d.home, "stop")
    assert r.returncode == 0 and "agentd stopped" in r.stdout


def test_init_writes_commented_config(tmp_path: Path) -> None:
    home = tmp_path / "fresh"
    r = run_cli(home, "init")
    assert r.returncode == 0 and "wrote" in r.stdout
    text = (home / "config.toml").read_text()
    assert text.startswith("#") and 'api_listen = "127.0.0.1:4200"' in text
    r = run_cli(home, "init")
    assert "kept existing" in r.stdout


def doctor(home: Path, port: int | None = None, **env: str) -> tuple[int, dict[str, dict]]:
    r = run_cli(home, "doctor", "--json", port=port, env_extra=env)
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    return r.returncode, checks


def test_doctor_healthy_install(daemon_factory) -> None:
    d = daemon_factory(env_extra={"ANTHROPIC_API_KEY": "x"})
    (d.home / "agents").mkdir(exist_ok=True)
    (d.home / "agents" / "ok.toml").write_text('name = "ok"\n')
    code, checks = doctor(d.home, d.port)
    assert code == 0
    assert checks["daemon"]["status"] == "ok"
    assert checks["config"]["status"] == "ok"
    assert checks["database"]["status"] == "ok"
    assert checks["agent_manifests"]["status"] == "ok"
    assert checks["provider_keys"]["status"] == "ok"
    assert checks["disk_space"]["status"] in ("ok", "warn")


def test_doctor_reports_failures(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    (home / "agents").mkdir()
    (home / "agents" / "bad.toml").write_text('name = 3\n')
    (home / "data").mkdir()
    (home / "data" / "agentd.db").write_bytes(b"not a database at all....")
    (home / "daemon.json").write_text(json.dumps({"listen_addr": "127.0.0.1:1", "pid": 1, "started_at": "x"}))
    (home / "secrets.env").write_text("X=1\n")
    os.chmod(home / "secrets.env", 0o644)
    # A broken SQLite file is what is checked here, whatever backend the suite runs on.
    code, checks = doctor(home, free_port(), AGENTD_DATABASE_URL="")
    assert code == 1
    assert checks["database"]["status"] == "fail"
    assert checks["agent_manifests"]["status"] == "fail" and "bad.toml" in checks["agent_manifests"]["message"]
    assert checks["stale_daemon_file"]["status"] == "warn"
    assert checks["secrets_file"]["status"] == "warn"
    assert checks["provider_keys"]["status"] == "warn"
    r = run_cli(home, "doctor", port=free_port())
    assert "[fail]" in r.stdout and r.returncode == 1


def test_doctor_with_broken_config(tmp_path: Path) -> None:
    home = make_home(tmp_path, "api_listen = [\n")
    code, checks = doctor(home)
    assert code == 1 and checks["config"]["status"] == "fail"


def test_a_key_agentd_does_not_read_is_named_by_doctor_and_the_start(daemon_factory) -> None:
    d = daemon_factory(FAST_API + "threds = 4\n[channels]\nwrkers = 2\n")
    code, checks = doctor(d.home, d.port)
    assert (code, checks["config"]) == (0, {
        "check": "config", "status": "warn",
        "message": f"{d.home / 'config.toml'} parsed; keys agentd does not read, ignored: api.threds, channels.wrkers"})
    for key in ("api.threds", "channels.wrkers"):
        assert f"WARNING agentd.daemon: config key {key} is not one agentd reads: it is ignored " \
               "(see docs/configuration.md)" in d.log()


def test_doctor_fails_what_start_would_fail_on(tmp_path: Path) -> None:
    home = make_home(tmp_path / "latin1")
    (home / "config.toml").write_bytes("# caf\xe9\n".encode("latin-1"))
    code, checks = doctor(home)
    assert (code, checks["config"]) == (1, {"check": "config", "status": "fail",
                                            "message": f"{home / 'config.toml'} is not UTF-8 text"})
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    code, checks = doctor(afile)
    # Nothing else can be read from a home that is a file: the one check is the whole answer.
    assert (code, checks) == (1, {"home_dir": {"check": "home_dir", "status": "fail",
                                               "message": f"{afile} exists but is not a directory"}})
    # Tables read by the channels, the cluster and A2A at start, checked before it.
    for text, fault in (('[channels]\nworkers = "x"\n', "config key channels.workers: expected an integer, got str"),
                        ("[cluster]\nlease_secs = 0\n", "config key cluster.lease_secs: must be a number between 1 and 3600")):
        home = make_home(tmp_path / fault.split()[2], text)
        code, checks = doctor(home)
        assert (code, checks["config"]) == (1, {"check": "config", "status": "fail",
                                                "message": f"invalid config {home / 'config.toml'}: {fault}"})
        started = run_cli(home, "start", port=free_port())
        assert (started.returncode, started.stderr) == (1, f"error: invalid config {home / 'config.toml'}: {fault}\n")
    home = make_home(tmp_path / "busy")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, checks = doctor(home, port)
    assert (code, checks["port"]) == (1, {"check": "port", "status": "fail",
                                          "message": f"127.0.0.1:{port} is in use by another program"})


def test_a_secrets_file_that_is_not_utf8_fails_the_start_and_doctor_naming_it(tmp_path: Path) -> None:
    """secrets.env is read by the boot, after the port is bound: the start ends with the error
    and leaves no daemon.json; doctor fails the file with the same words."""
    home = make_home(tmp_path)
    (home / "secrets.env").write_bytes("KEY=caf\xe9\n".encode("latin-1"))
    os.chmod(home / "secrets.env", 0o600)
    error = (f"cannot read {home / 'secrets.env'}: 'utf-8' codec can't decode byte 0xe9 in position 7: "
             "invalid continuation byte")
    started = run_cli(home, "start", port=free_port())
    assert (started.returncode, started.stderr.splitlines()[-1]) == (1, f"error: {error}")
    assert not (home / "daemon.json").exists()
    code, checks = doctor(home)
    assert (code, checks["secrets_file"]) == (1, {"check": "secrets_file", "status": "fail", "message": error})

def test_python_dash_m_and_console_script_agree(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "agentd", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    for command in ("start", "stop", "status", "doctor", "init"):
        assert command in r.stdout


@pytest.mark.parametrize("words", [[], ["workflow"], ["cron"]])
def test_a_missing_command_shows_the_choices_and_fails(words: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "agentd", *words], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 2
    assert r.stdout == ""
    expected = {(): "{start,stop,status,doctor,init,usage,budget,workflow,cron}",
                ("workflow",): "{create,list,run,runs,delete}", ("cron",): "{list,add,run,pause,resume,rm}"}
    assert f"usage: agentd {' '.join(words)}".replace("  ", " ") in r.stderr
    assert expected[tuple(words)] in r.stderr


def test_option_help_states_each_default_once_in_words() -> None:
    r = subprocess.run([sys.executable, "-m", "agentd", "usage", "--help"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0
    assert "ISO 8601 start (default: start of this month, UTC)\n" in r.stdout
    assert "(default: '')" not in r.stdout and "(default: False)" not in r.stdout


@pytest.mark.slow
def test_graceful_shutdown_lets_inflight_request_finish(daemon_factory) -> None:
    d = daemon_factory()
    response: dict = {}
    import threading
    in_flight = threading.Event()

    def slow_stream() -> None:
        r = requests.get(f"{d.url}/api/_sse/ticks?n=3&interval=0.7", stream=True, timeout=30)
        chunks = []
        for chunk in r.iter_content(chunk_size=None):
            chunks.append(chunk)
            in_flight.set()
        response["text"] = b"".join(chunks).decode()

    t = threading.Thread(target=slow_stream)
    t.start()
    # The signal comes once the first tick is in: before that the request may not have reached the daemon.
    assert in_flight.wait(30), "the stream never started"
    d.proc.send_signal(15)
    t.join(30)
    assert '"done":true' in response.get("text", "")
    assert d.proc.wait(15) == 0


def test_a_second_sigterm_during_the_graceful_stop_exits_at_once(daemon_factory) -> None:
    """The first SIGTERM starts the graceful stop (here held by a stream in flight, for up to
    a minute); a second one ends the daemon now, with exit code 1 and no daemon.json left."""
    d = daemon_factory(FAST_API.replace("shutdown_grace_secs = 5", "shutdown_grace_secs = 60"))
    d.expect_crash("a second SIGTERM exits at once with 1")
    stream = requests.get(f"{d.url}/api/_sse/ticks?n=100&interval=0.5", stream=True, timeout=30)
    try:
        assert any(line.startswith(b"event: tick") for line in stream.iter_lines()), "the stream is under way"
        d.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM received" in d.log(), "the first SIGTERM's log line")
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(30) == 1
    finally:
        stream.close()
    assert daemon_said(d)[-2:] == ["SIGTERM received: shutting down", "second SIGTERM: exiting now"]
    assert TRACEBACK not in d.log()
    assert not (d.home / "daemon.json").exists()

def test_a_held_home_lock_refuses_the_start(tmp_path: Path) -> None:
    import fcntl
    home = make_home(tmp_path)
    with open(home / "daemon.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        r = run_cli(home, "start", port=free_port())
    assert r.returncode == 1
    assert f"another agentd is starting or running with home {home} (it holds {home / 'daemon.lock'})" in r.stderr


@pytest.mark.parametrize("command", ["start", "init"])
def test_a_home_that_is_a_file_is_a_clear_error(tmp_path: Path, command: str) -> None:
    afile = tmp_path / "home-file"
    afile.write_text("x")
    r = run_cli(afile, command, port=free_port())
    assert r.returncode == 1 and r.stderr.strip() == f"error: {afile} is not a directory: set AGENTD_HOME to a directory"
