"""The PostgreSQL switch of the test suite: a real server and a fresh database per daemon.

`python -m pytest --db=postgres` (or env `AGENTD_TEST_DB=postgres`) starts one temporary
PostgreSQL cluster per test process (initdb + pg_ctl in a temp dir on a free port; as root
through `runuser -u postgres`), and every daemon the suite starts gets its own database
on it (`AGENTD_DATABASE_URL`). A home gets the same database again when a test restarts a
daemon on it, so persistence tests test persistence. `AGENTD_TEST_DATABASE_URL` instead
names an existing server (an admin URL such as `postgresql://postgres@127.0.0.1:5432/postgres`)
on which the per-daemon databases are created (and dropped at the end).
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ENABLED = False  # set by conftest from --db / AGENTD_TEST_DB / AGENTD_TEST_DATABASE_URL


def enable() -> None:
    global ENABLED
    ENABLED = True


def pg_bindir() -> str | None:
    """Directory holding initdb and pg_ctl (PATH first, then Debian's versioned dirs)."""
    found = shutil.which("initdb")
    if found:
        return str(Path(found).parent)
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return str(Path(dirs[0]).parent) if dirs else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    """A throwaway PostgreSQL server in a temp dir (fsync off: test data only)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="agentd-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.bindir = pg_bindir()
        if self.bindir is None:
            raise RuntimeError("--db=postgres: no initdb found (apt-get install postgresql)")
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root.
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, "postgres", "postgres")
            self._as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        result = subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def start(self) -> "Cluster":
        self._run(f"{self.bindir}/initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8", "--locale=C")
        # Many daemons, each with a connection per busy thread: room for all of them.
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=1000 "
                   "-c shared_buffers=64MB")
        self._run(f"{self.bindir}/pg_ctl", "-D", str(self.data), "-o", options,
                  "-l", str(self.dir / "server.log"), "-w", "-t", "60", "start")
        return self

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        try:
            self._run(f"{self.bindir}/pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        # Removed by a process of its own: a worker's cluster holds a database per daemon
        # (gigabytes, hundreds of thousands of files), and xdist kills a worker still busy
        # 10 s after the run's end, which left the folder half removed in the temp directory.
        subprocess.Popen(["rm", "-rf", str(self.dir)], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Databases:
    """Creates one database per key (a daemon's home) on the server at `admin_url`."""

    def __init__(self, admin_url: str, cluster: Cluster | None = None) -> None:
        self.admin_url = admin_url
        self.cluster = cluster
        self._by_key: dict[str, str] = {}
        self._lock = threading.Lock()

    def url_for(self, key: str) -> str:
        """The URL of the database belonging to `key`, created on first request."""
        with self._lock:
            name = self._by_key.get(key)
            if name is None:
                name = f"t_{uuid.uuid4().hex[:16]}"
                self._admin(f"CREATE DATABASE {name}")
                self._by_key[key] = name
        parts = urlsplit(self.admin_url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))

    def new_url(self) -> str:
        """A fresh database nobody else uses."""
        return self.url_for(uuid.uuid4().hex)

    def _admin(self, sql: str) -> None:
        import psycopg2

        conn = psycopg2.connect(self.admin_url)
        try:
            conn.autocommit = True
            conn.cursor().execute(sql)
        finally:
            conn.close()

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()  # the whole cluster goes
            return
        for name in self._by_key.values():
            try:
                self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            except Exception:  # noqa: BLE001 - best effort on a server we do not own
                pass


_DATABASES: Databases | None = None
_START_LOCK = threading.Lock()


def databases() -> Databases:
    """The process's database factory (starting the temp cluster on first use)."""
    global _DATABASES
    with _START_LOCK:
        if _DATABASES is None:
            external = os.environ.get("AGENTD_TEST_DATABASE_URL", "").strip()
            if external:
                _DATABASES = Databases(external)
            else:
                cluster = Cluster().start()
                _DATABASES = Databases(cluster.admin_url, cluster)
            atexit.register(_DATABASES.close)
        return _DATABASES


def url_for_home(home: Path) -> str | None:
    """AGENTD_DATABASE_URL for a daemon on `home` (None when the suite runs on SQLite)."""
    if not ENABLED:
        return None
    return databases().url_for(str(Path(home).resolve()))
