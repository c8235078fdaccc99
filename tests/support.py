"""Test support: start the real `agentd start` in a subprocess with a temp home."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import requests

import pgtest
import zygote

# Tests hammer the API; the default 30 req/s would turn them into rate-limit tests.
FAST_API = "[api]\nrate_limit_per_second = 100000\nrate_limit_burst = 100000\nshutdown_grace_secs = 5\n"

TRACEBACK = "Traceback (most recent call last)"

# Every Daemon ever started in this test process, in start order. The autouse fixture
# `_daemons_stop_cleanly` (conftest.py) checks each one's log and exit code.
STARTED: list["Daemon"] = []
# Where each process a test started under mutmut lists the mutated functions it ran.
HIT_FILES: list[Path] = []
LAUNCHER = Path(__file__).resolve().parent / "mutmut_daemon.py"


def agentd_command(args: list[str], env: dict[str, str], hits: Path | None = None) -> list[str]:
    """`python -m agentd ARGS` (`python -c SCRIPT` when ARGS is `-c SCRIPT`). Under mutmut the
    launcher of tests/mutmut_daemon.py runs it instead: the mutated copy, listing the functions
    it ran in `hits` (a file of its own if None) for the test's stats."""
    if not os.environ.get("MUTANT_UNDER_TEST"):
        return [sys.executable, *(args if args[:1] == ["-c"] else ["-m", "agentd", *args])]
    hits = hits or Path(tempfile.gettempdir()) / f"agentd-mutmut-hits-{os.getpid()}-{len(HIT_FILES)}.txt"
    env["AGENTD_MUTMUT_HITS"] = str(hits)
    if hits not in HIT_FILES:
        HIT_FILES.append(hits)
    return [sys.executable, str(LAUNCHER), *args]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1, below the ephemeral range.

    Servers in these tests restart on the port they had. A port from the ephemeral range
    can be taken while its server is down by any outgoing connection's source port, even
    by a client's reconnect to that very port (a TCP self-connect), and the restart then
    cannot bind it for as long as that socket lives. Below the range nothing takes it
    but another listener.
    """
    low = _ephemeral_low()
    for _ in range(500):
        port = random.randint(max(1025, low - 20_000), low - 1)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port below the ephemeral range")


def private_cache(name: str) -> Path | None:
    """`<temp>/agentd-tests-<uid>/<name>`, kept from run to run for what tools compute once
    (compiled bytecode, Hypothesis's character tables); None when that folder is not a real
    folder of this user's own, whose contents another user could have written."""
    root = Path(tempfile.gettempdir()) / f"agentd-tests-{os.getuid()}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        found = root.lstat()
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
            return None
        (root / name).mkdir(exist_ok=True)
    except OSError:
        return None
    return root / name


def make_home(root: Path, config_text: str | None = None) -> Path:
    """A fresh AGENTD_HOME with the given config.toml (FAST_API when None)."""
    home = root / "agentd-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(FAST_API if config_text is None else config_text)
    return home


def agentd_env(home: Path, port: int | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTD_")}
    env["AGENTD_HOME"] = str(home)
    if port is not None:
        env["AGENTD_LISTEN"] = f"127.0.0.1:{port}"
    env["PYTHONUNBUFFERED"] = "1"
    # Under --db=postgres every home has its own PostgreSQL database (tests/pgtest.py).
    database_url = pgtest.url_for_home(home)
    if database_url:
        env["AGENTD_DATABASE_URL"] = database_url
    env.update(extra)
    return env


def with_test_db(data: dict[str, Any], key: Path) -> dict[str, Any]:
    """`data` (a parsed config.toml) plus, under --db=postgres, a `database_url` for an
    in-process kernel or store keyed by `key` (a tmp path): the same key, the same database."""
    url = pgtest.url_for_home(key)
    return {**data, "database_url": url} if url else data


def store_url_for(key: Path):
    """The DatabaseUrl open_store() needs for an in-process store (None on SQLite)."""
    from agentd.store.backend import parse_database_url

    url = pgtest.url_for_home(key)
    return parse_database_url(url, "test", allow_password=True) if url else None


def put_session(store: Any, session_id: str, messages: list) -> None:
    """Make `messages` the stored session `session_id` of `store` (one row each, its JSON
    text ASCII-escaped, as another writer may have left it)."""
    import json

    from pony import orm

    with orm.db_session:
        store.db.execute("DELETE FROM session_messages WHERE session = $s", {"s": session_id})
        for message in messages:
            store.e.SessionMessageRow(session=session_id, body=json.dumps(message))


def db_rows(home: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of `sql` (`?` placeholders) read straight from the database of the daemon on
    `home`: its SQLite file, or under --db=postgres its PostgreSQL database."""
    url = pgtest.url_for_home(home)
    if url:
        import psycopg2

        with psycopg2.connect(url) as conn, conn.cursor() as cur:
            cur.execute(sql.replace("?", "%s"), params)
            return cur.fetchall()
    import sqlite3

    conn = sqlite3.connect(f"file:{Path(home) / 'data' / 'agentd.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def db_dump(home: Path) -> bytes:
    """Everything the daemon on `home` stored (the SQLite file, or every PostgreSQL row as
    text), for "this secret is nowhere in the database" checks."""
    url = pgtest.url_for_home(home)
    if not url:
        return (Path(home) / "data" / "agentd.db").read_bytes()
    tables = [r[0] for r in db_rows(home, "SELECT table_name FROM information_schema.tables "
                                          "WHERE table_schema = 'public'")]
    return b"\n".join(str(row).encode() for t in tables for row in db_rows(home, f'SELECT t::text FROM "{t}" t'))


# Whether daemons fork from this process's zygote (tests/zygote.py): the test session turns it
# on (conftest.py); the benchmarks that import this module measure processes of their own.
FORK_DAEMONS = False


def start_process(args: list[str], env: dict[str, str], log_path: Path,
                  hits: Path | None = None) -> subprocess.Popen | zygote.ForkedProcess:
    """`python -m agentd ARGS` with its output appended to `log_path`: forked from this worker's
    zygote (tests/zygote.py), or a process of its own under mutmut (the launcher runs it),
    outside the test session, with AGENTD_TEST_FORK=0, and where a fork would not start as a
    process of its own would (`zygote.shared`)."""
    command = agentd_command(args, env, hits)
    source = _zygote_for(command, args, env)
    if source is not None:
        return source.spawn(args, env, log_path)
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _zygote_for(command: list[str], args: list[str], env: dict[str, str]) -> zygote.Zygote | None:
    """The zygote to fork `command` from, or None when it is to be a process of its own."""
    if FORK_DAEMONS and command[1:] == ["-m", "agentd", *args] and os.environ.get("AGENTD_TEST_FORK") != "0":
        return zygote.shared(env)
    return None


def run_cli(home: Path, *args: str, port: int | None = None, timeout: float = 60,
            env_extra: dict[str, str] | None = None,
            allow_traceback: bool = False) -> subprocess.CompletedProcess:
    """Run `python -m agentd ARGS` to completion.

    A Python traceback in its output fails the calling test: a CLI answers with a message,
    never a crash. A test that expects one passes `allow_traceback=True`."""
    env = agentd_env(home, port, **(env_extra or {}))
    result = _run_to_completion(agentd_command(list(args), env), list(args), env, timeout)
    if not allow_traceback:
        for stream in (result.stdout, result.stderr):
            assert TRACEBACK not in stream, (
                f"`agentd {' '.join(args)}` printed a Python traceback (exit {result.returncode}):\n"
                f"{traceback_excerpt(stream)}")
    return result


def _run_to_completion(command: list[str], args: list[str], env: dict[str, str],
                       timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)`, forked from the zygote
    when it can be (its output goes through files there)."""
    source = _zygote_for(command, args, env)
    if source is None:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="agentd-cli-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        proc = source.spawn(args, env, out, errors=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(command, code, out.read_text(), err.read_text())


def traceback_excerpt(text: str, lines: int = 40) -> str:
    """The first traceback in `text` and the lines after it (for failure messages)."""
    start = text.find(TRACEBACK)
    if start < 0:
        return ""
    begin = text.rfind("\n", 0, start) + 1
    return "\n".join(text[begin:].splitlines()[:lines])


class Daemon:
    """A real daemon process: `python -m agentd start` on a free port."""

    def __init__(self, home: Path, port: int | None = None, api_key: str = "",
                 env_extra: dict[str, str] | None = None) -> None:
        self.home = home
        self.port = port or free_port()
        self.port_picked = not port   # free_port() chose it: another one will do as well
        self.api_key = api_key
        self.env_extra = env_extra or {}
        self.proc: subprocess.Popen | zygote.ForkedProcess | None = None
        self.log_path = home / "daemon.log"
        # Set by expect_crash(): this daemon may exit non-zero / log a traceback on purpose.
        self.crash_expected: str = ""
        self.killed = False           # the test SIGKILLed it: its exit code says nothing
        self.checked_log_offset = 0   # log bytes already checked for tracebacks
        self.exit_checked = False     # the exit code was looked at (report it once)
        self.settled = False          # exited and fully checked: nothing new can come
        self.http = requests.Session()
        if api_key:
            self.http.headers["Authorization"] = f"Bearer {api_key}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hits_path(self) -> Path:
        """Where the daemon lists the mutated functions it ran (mutmut's stats phase only)."""
        return self.home / "mutmut-hits.txt"

    def start(self, wait: bool = True) -> "Daemon":
        STARTED.append(self)
        self.settled = False
        first = self.proc is None
        self._launch()
        if not wait:
            return self
        try:
            self.wait_healthy()
        except RuntimeError:
            # free_port()'s port was free when it looked; another worker's server may have
            # taken it before the daemon bound it. A first start moves to another port.
            if not (first and self.port_picked and self.proc.poll() is not None
                    and f"127.0.0.1:{self.port} is already in use" in self.log()):
                raise
            self.port = free_port()
            self._launch()
            self.wait_healthy()
        return self

    def _launch(self) -> None:
        env = agentd_env(self.home, self.port, **self.env_extra)
        self.proc = start_process(["start"], env, self.log_path, self.hits_path)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        # Only a deadline: a ready daemon answers at once, and on a loaded host its app can
        # take long to load.
        if "MUTANT_UNDER_TEST" in os.environ:   # set ("" for the clean run) by mutmut for every run
            timeout = max(timeout, 120.0)   # mutated code imports mutmut; mutation runs load the machine
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(f"{self.url}/api/health", timeout=1).ok:
                    # The probe answers while the app still loads (agentd/server/startgate.py); any
                    # other request waits for the app, so one answer means it is ready.
                    requests.get(f"{self.url}/api/status", timeout=max(1.0, deadline - time.monotonic()))
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"daemon not healthy after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 60)
        return self.http.request(method, f"{self.url}{path}", **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("PUT", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", path, **kwargs)

    def daemon_file(self) -> dict[str, Any] | None:
        path = self.home / "daemon.json"
        return json.loads(path.read_text()) if path.exists() else None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, SIGKILL as a last resort; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise RuntimeError(f"daemon ignored SIGTERM:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: the crash case (no cleanup runs)."""
        if self.proc is not None and self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
            self.proc.wait(10)

    # -- the stop-time check ---------------------------------------------------------------------
    def expect_crash(self, reason: str) -> "Daemon":
        """Opt out of the clean-stop check: this test makes the daemon fail on purpose."""
        self.crash_expected = reason
        return self

    def new_log(self) -> str:
        """Log text written since the last call (the part not yet checked)."""
        if self.settled:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.checked_log_offset)
                data = f.read()
        except OSError:
            return ""
        self.checked_log_offset += len(data)
        return data.decode(errors="replace")

    def problems(self) -> list[str]:
        """Why this daemon did not behave: a traceback in its (new) log, a non-zero exit."""
        # Whether it had exited before its log is read: then the log read is the whole of it.
        exited = self.proc is not None and self.proc.poll() is not None
        if self.crash_expected:
            self.settled = exited
            return []
        found = []
        text = self.new_log()
        if TRACEBACK in text:
            found.append(f"daemon {self.url} (home {self.home}) logged a Python traceback:\n"
                         f"{traceback_excerpt(text)}")
        if self.proc is not None and not self.killed and not self.exit_checked:
            code = self.proc.poll()
            self.exit_checked = code is not None
            if code not in (None, 0):
                found.append(f"daemon {self.url} (home {self.home}) exited with code {code}:\n"
                             f"{self.log()[-3000:]}")
        # Every test checks every daemon its worker started: a settled one costs nothing more.
        self.settled = exited and (self.exit_checked or self.killed)
        return found

    def stop_and_check(self) -> list[str]:
        """Stop (SIGTERM) if still running, then report problems (see `problems`)."""
        try:
            self.stop()
        except RuntimeError as exc:
            if not self.crash_expected:
                return [str(exc)]
        return self.problems()


def stop_shared(daemon: Daemon) -> None:
    """Teardown of a module-scoped daemon: it must stop with exit 0 and a clean log."""
    import pytest

    problems = daemon.stop_and_check()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


def take_daemon_hits() -> set[str]:
    """Names of mutated functions the daemons ran since the last call (mutmut stats phase)."""
    names: set[str] = set()
    for path in HIT_FILES:
        taken = path.with_suffix(".taken")
        try:
            os.replace(path, taken)
        except FileNotFoundError:
            continue
        names.update(line for line in taken.read_text(encoding="utf-8").splitlines() if line)
        taken.unlink()
    return names


def children_named(name: str) -> int:
    """How many child processes of this process (running or zombie) have the command `name`."""
    count = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2:].split()
        if text[text.index("(") + 1:text.rindex(")")] == name and int(rest[1]) == os.getpid():
            count += 1
    return count


def in_forked_child(check: Callable[[], bool]) -> bool:
    """Run `check()` in a forked child of this process; True when it returned true there
    (an exception counts as false: a child never raises into the test)."""
    read, write = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            try:
                ok = bool(check())
            except BaseException:  # noqa: BLE001 - reported as false
                ok = False
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        return os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.close(write)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    """Poll `cond` every 20 ms until it is true; fail the test, naming `what`, after `timeout` s."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


MINUTE, DAY = 60, 86400


def within_one_utc_period(seconds: float, period: int = MINUTE) -> None:
    """Return once the next `seconds` fall in one UTC minute (or day: `period=DAY`, which also
    keeps them in one month): at once, or just after the period ends when less is left of it.
    For checks of what a limit counts per UTC minute or day, on a host that may be slow."""
    left = period - time.time() % period
    if left < seconds:
        time.sleep(left + 0.1)
