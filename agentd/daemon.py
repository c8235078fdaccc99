"""Run the daemon in the foreground: kernel + Flask app on the server layer
(agentd/server/), daemon.json, signals and a graceful shutdown.

The port is bound first and served through a `StartGate` (agentd/server/startgate.py) while a
boot thread imports the app and opens the kernel: the liveness probe answers at once,
other requests wait for the app. A boot that fails ends the daemon with its error.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from agentd.cli.client import DaemonInfo, is_healthy, process_identity, read_daemon_file, write_daemon_file
from agentd import tracing
from agentd.config import Config, unknown_keys, unwritable_home
from agentd.errors import AgentdError
from agentd.logs import setup_logging
from agentd.malloc_tuning import tune_malloc
from agentd.timestamps import iso, utcnow
from agentd.server import serve
from agentd.server.startgate import StartGate

if TYPE_CHECKING:
    from agentd.kernel import Kernel

SWITCH_INTERVAL = float(os.environ.get("AGENTD_SWITCH_INTERVAL", "0.005"))
# Collect the youngest generation every 7,000 net container allocations instead of 700:
# with 32 requests in flight their objects outlive a young collection, get promoted and
# make the older generations' (whole-heap) passes frequent (docs/performance.md has the
# figures).
GC_THRESHOLD = (7000, 10, 10)
log = logging.getLogger("agentd.daemon")


class StartError(AgentdError):
    """The daemon cannot start; the message says why."""


def check_not_running(config: Config) -> None:
    """Refuse to start next to a live daemon; remove a stale daemon.json."""
    info = read_daemon_file(config.daemon_file)
    if info is None:
        if config.daemon_file.exists():
            log.warning("removing unreadable %s", config.daemon_file)
            config.daemon_file.unlink(missing_ok=True)
        return
    if is_healthy(info.base_url):
        raise StartError(f"agentd is already running at {info.base_url} (pid {info.pid})")
    log.warning("removing stale %s (pid %s is not answering)", config.daemon_file, info.pid)
    config.daemon_file.unlink(missing_ok=True)


def lock_home(config: Config) -> IO[bytes]:
    """Hold `<home>/daemon.lock` for the daemon's life (`Daemon.release_home`, or the exit, drops it).

    `check_not_running` reads daemon.json, which a daemon writes only once it listens: two
    starts at the same moment both found none and both ran on one home (one database file,
    one daemon.json). The lock closes that window; a second start fails at once."""
    path = config.home / "daemon.lock"
    try:
        config.home.mkdir(parents=True, exist_ok=True)
        handle = open(path, "ab")
    except OSError as exc:
        raise StartError(unwritable_home(config.home, exc)) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise StartError(f"another agentd is starting or running with home {config.home} "
                         f"(it holds {path})") from None
    return handle


class Daemon:
    """One running daemon: owns the kernel, the waitress server and daemon.json."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = threading.Event()
        self.kernel: Kernel | None = None
        self.server = None
        self.gate = StartGate(config)
        self._boot_thread: threading.Thread | None = None
        self._boot_error: BaseException | None = None
        self._store: Any = None
        self._home_lock: IO[bytes] | None = None

    def _pool_stats(self) -> dict[str, int]:
        return serve.pool_stats(self.server)

    def request_stop(self) -> None:
        """Ask the loop to stop; safe from any thread and from the first signal's handler."""
        self._stop.set()
        if self.server is not None:
            serve.wake(self.server)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            self._remove_daemon_file()  # nothing will answer at its address any more
            os._exit(1)
        # The flag first: a second signal can run this handler again while the line below is
        # being logged, and must find the stop under way. The server is still open here (the
        # loop closes it only once the flag is set), so its wake-up pipe ends the poll now
        # instead of at the poll's timeout.
        self.request_stop()
        log.info("%s received: shutting down", signal.Signals(signum).name)

    def start(self) -> None:
        """Bind the port, write daemon.json, then open the kernel and build the app in the
        boot thread (the gate answers the liveness probe meanwhile)."""
        cfg = self.config
        check_not_running(cfg)
        self._home_lock = lock_home(cfg)
        # The database first: a locked or unreadable one fails the start before it listens,
        # and a daemon that answers its probe has its database file.
        self._store = open_daemon_store(cfg)
        try:
            from agentd.cluster.config import cluster_settings

            # Every answer names the daemon (routes_cluster.py); the gate's probe too.
            self.gate.extra_headers = [("X-Agentd-Daemon", cluster_settings(cfg.raw, cfg.api_listen).daemon_id)]
            # OpenTelemetry, when configured: before any request, so every request is traced.
            tracing.configure(cfg.telemetry.otel)
        except AgentdError:
            self._store.close()
            raise
        host, port = cfg.host, cfg.port
        try:
            self.server = serve.listen(cfg, self.gate)
        except OSError as exc:
            self._store.close()
            if exc.errno == errno.EADDRINUSE:
                raise StartError(f"address {host}:{port} is already in use") from None
            raise StartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        listen = f"{host}:{self.server.effective_port}"
        write_daemon_file(cfg.daemon_file, DaemonInfo(listen, os.getpid(), iso(utcnow()),
                                                 process_identity(os.getpid())))
        log.info("agentd listening on http://%s (home %s)", listen, cfg.home)
        self._boot_thread = threading.Thread(target=self._boot, name="agentd-boot", daemon=True)
        self._boot_thread.start()

    def _boot(self) -> None:
        """Open the kernel and build the app; on failure stop the daemon with the error."""
        began = time.monotonic()
        # No collections while the boot builds what lives as long as the process (frozen
        # below): they would only walk it.
        gc.disable()
        try:
            delay = float(os.environ.get("AGENTD_TEST_BOOT_DELAY", "0") or 0)
            if delay > 0:  # tests only: widen the window in which the gate serves alone
                time.sleep(delay)
            from agentd.api import create_app
            from agentd.kernel import Kernel
            from agentd.providers import load_secrets

            # Keys saved through the API come back; the real environment wins.
            load_secrets(self.config.secrets_path)
            kernel = Kernel(self.config, self._store)
            kernel.set_shutdown_hook(self.request_stop)
            app = create_app(kernel, self._pool_stats, limiter=self.gate.limiter)
            self.kernel = kernel
            # What boot built (modules, the app, the kernel) lives as long as the process:
            # out of the collector's sight, full collections walk only what serving makes.
            # (Before the app takes requests, so no request's objects are frozen with it.)
            gc.freeze()
            # From now on waitress calls the app directly; the gate is out of the path.
            self.server.application = app
            self.gate.open(app)
            log.info("agentd ready (kernel and app loaded in %.2fs)", time.monotonic() - began)
            # This thread ends here: its database connection goes with it.
            kernel.store.db.disconnect()
        except BaseException as exc:  # noqa: BLE001 - reported by serve(), the daemon exits 1
            self._boot_error = exc
            self.gate.fail(exc.message if isinstance(exc, AgentdError) else str(exc))
            self.request_stop()
        finally:
            gc.enable()

    def serve(self) -> None:
        """Run until a signal or POST /api/shutdown, then shut down gracefully."""
        server = self.server
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self._stop.is_set():
                serve.poll(server, 0.2)
        finally:
            try:
                self._drain()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    def _drain(self) -> None:
        if self._boot_thread is not None:
            self._boot_thread.join()  # a stop during the boot waits for the kernel, then closes it
        server, kernel = self.server, self.kernel
        if kernel is None:
            self._abort()
            return
        # Stop means stop: runs end now and their provider connections close at once,
        # so the grace period below only has to flush answers.
        kernel.stop_runs()
        serve.drain(server, self.config.api.shutdown_grace_secs)
        kernel.close()
        tracing.shutdown()
        self._remove_daemon_file()
        log.info("agentd stopped")

    def release_home(self) -> None:
        """Let another daemon start on this home (after a stop, or a start that failed)."""
        if self._home_lock is not None:
            self._home_lock.close()
            self._home_lock = None

    def _remove_daemon_file(self) -> None:
        """Remove daemon.json if it is this process's (another daemon's is left alone)."""
        info = read_daemon_file(self.config.daemon_file)
        if info is not None and info.pid == os.getpid():
            self.config.daemon_file.unlink(missing_ok=True)


    def _abort(self) -> None:
        """The boot failed: close the server and daemon.json, then raise its error."""
        serve.close(self.server)
        self._remove_daemon_file()
        if self._store is not None:
            self._store.close()
        exc = self._boot_error
        if isinstance(exc, AgentdError):
            raise exc
        raise StartError(f"agentd failed to start: {exc}") from exc


def open_daemon_store(config: Config) -> Any:
    """The store, opened as `Kernel.open` opens it (imports Pony, not the kernel)."""
    from agentd.store import open_store

    config.home.mkdir(parents=True, exist_ok=True)
    store = open_store(config.db_path, config.database)
    if store.backend != "sqlite":
        log.info("database: %s %s", store.backend, store.where)  # `where` is masked (as Kernel.open)
    return store


def tune_interpreter(malloc_arenas: int, mmap_threshold_kb: int) -> None:
    """The process-wide interpreter settings a busy threaded daemon wants; glibc's malloc is
    tuned before any server thread starts (agentd/malloc_tuning.py; 0: glibc's default)."""
    tune_malloc(malloc_arenas, mmap_threshold_kb)
    # The GIL switch interval: Python's own 5 ms unless AGENTD_SWITCH_INTERVAL sets it. A
    # shorter one hands the GIL (and the locks waiting on it) between threads sooner, at the
    # price of more context switches per request (README, Performance, has the A/B runs).
    sys.setswitchinterval(SWITCH_INTERVAL)
    gc.set_threshold(*GC_THRESHOLD)


def run_daemon(config: Config) -> None:
    """`agentd start`: raises StartError (or another AgentdError) if it cannot start."""
    setup_logging(config.log_level, config.log_format)
    for key in unknown_keys(config.raw):
        log.warning("config key %s is not one agentd reads: it is ignored (see docs/configuration.md)", key)
    tune_interpreter(config.api.malloc_arenas, config.api.malloc_mmap_threshold_kb)
    daemon = Daemon(config)
    try:
        daemon.start()
        daemon.serve()
    finally:
        daemon.release_home()
