"""Run the daemon in the foreground: kernel + Flask app on waitress, daemon.json,
signals and a graceful shutdown.

The port is bound first and served through a `StartGate` (agentd/startgate.py) while a
boot thread imports the app and opens the kernel: the liveness probe answers at once,
other requests wait for the app. A boot that fails ends the daemon with its error.

We drive waitress's event loop ourselves (one poll at a time) instead of calling
`server.run()`, so that shutdown can stop accepting, keep flushing in-flight
responses for a bounded time, and only then close everything.
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

import waitress
from waitress import wasyncore

from agentd.api.early_refusal import install as install_early_refusal
from agentd.api.ws_transport import close_websockets, install as install_ws_transport
from agentd.client import DaemonInfo, is_healthy, process_identity, read_daemon_file, write_daemon_file
from agentd.config import Config
from agentd.errors import AgentdError
from agentd.kernel_time import iso, utcnow
from agentd.startgate import StartGate

if TYPE_CHECKING:
    from agentd.kernel import Kernel

SWITCH_INTERVAL = float(os.environ.get("AGENTD_SWITCH_INTERVAL", "0.005"))
# Collect the youngest generation every 7,000 net container allocations instead of 700:
# with 32 requests in flight their objects outlive a young collection, get promoted and
# make the older generations' (whole-heap) passes frequent. Measured: 7-9 % of the CPU per
# request at 32 connections, 1-2 % at one (README, Performance).
GC_THRESHOLD = (7000, 10, 10)
log = logging.getLogger("agentd.daemon")


class StartError(AgentdError):
    """The daemon cannot start; the message says why."""


def setup_logging(level: str) -> None:
    """Log to stderr in one readable line per record."""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
                        stream=sys.stderr, force=True)
    # waitress's per-queue warnings are noise for a daemon sized for streams.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)


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


def lock_home(config: Config) -> IO[str]:
    """Hold `<home>/daemon.lock` for the daemon's life (`Daemon.release_home`, or the exit, drops it).

    `check_not_running` reads daemon.json, which a daemon writes only once it listens: two
    starts at the same moment both found none and both ran on one home (one database file,
    one daemon.json). The lock closes that window; a second start fails at once."""
    config.home.mkdir(parents=True, exist_ok=True)
    path = config.home / "daemon.lock"
    handle = open(path, "a+", encoding="utf-8")
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
        self._home_lock: IO[str] | None = None

    def _pool_stats(self) -> dict[str, int]:
        dispatcher = self.server.task_dispatcher if self.server is not None else None
        if dispatcher is None:
            return {}
        # `threads` is the pool's size; `started` how many of them have run so far.
        return {"threads": dispatcher.limit,
                "started": len(dispatcher.threads), "busy": dispatcher.active_count,
                "queued": len(dispatcher.queue)}

    def request_stop(self) -> None:
        """Ask the loop to stop; safe from any thread (not from a signal handler)."""
        self._stop.set()
        server = self.server
        if server is not None:
            try:
                server.trigger.pull_trigger()
            except OSError:
                pass

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            self._remove_daemon_file()  # nothing will answer at its address any more
            os._exit(1)
        log.info("%s received: shutting down", signal.Signals(signum).name)
        # Only set the flag: the poll loop wakes within its short timeout.
        self._stop.set()

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
            from agentd.cluster_config import cluster_settings

            # Every answer names the daemon (routes_cluster.py); the gate's probe too.
            self.gate.extra_headers = [("X-Agentd-Daemon", cluster_settings(cfg.raw, cfg.api_listen).daemon_id)]
        except AgentdError:
            self._store.close()
            raise
        host, port = cfg.host, cfg.port
        try:
            from agentd.dispatcher import LifoTaskDispatcher

            dispatcher = LifoTaskDispatcher()
            self.server = waitress.create_server(
                self.gate, host=host, port=port, threads=cfg.api.threads, _dispatcher=dispatcher,
                connection_limit=max(1000, cfg.api.threads * 4), asyncore_use_poll=True,
                channel_timeout=300, ident="agentd",
                # waitress would strip X-Forwarded-* before agentd.api.proxy can judge
                # them; that layer strips them itself for untrusted peers.
                clear_untrusted_proxy_headers=not cfg.api.trusted_proxies)
            # (No channel_request_lookahead: ws_transport.peer_left tells a run that its
            # client left without waitress's loop polling every busy channel.)
        except OSError as exc:
            self._store.close()
            if exc.errno == errno.EADDRINUSE:
                raise StartError(f"address {host}:{port} is already in use") from None
            raise StartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        # (waitress starts the threads of its own dispatcher only; `threads=` still sizes the
        # channel limits above.)
        dispatcher.set_thread_count(cfg.api.threads)
        install_ws_transport(self.server)
        install_early_refusal(self.server, cfg)  # cross-site / foreign-Host bodies never read
        listen = f"{host}:{self.server.effective_port}"
        write_daemon_file(cfg.daemon_file, DaemonInfo(listen, os.getpid(), iso(utcnow()),
                                                 process_identity(os.getpid())))
        log.info("agentd listening on http://%s (home %s)", listen, cfg.home)
        self._boot_thread = threading.Thread(target=self._boot, name="agentd-boot", daemon=True)
        self._boot_thread.start()

    def _boot(self) -> None:
        """Open the kernel and build the app; on failure stop the daemon with the error."""
        began = time.monotonic()
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

    def serve(self) -> None:
        """Run until a signal or POST /api/shutdown, then shut down gracefully."""
        server = self.server
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self._stop.is_set():
                wasyncore.loop(timeout=0.2, map=server._map, use_poll=True, count=1)
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
        # WebSocket handlers wait on their client; "going away" frees their workers now.
        close_websockets(server)
        # Stop accepting: close only the listening socket, keep the trigger and
        # the open channels so in-flight responses are still flushed.
        try:
            wasyncore.dispatcher.close(server)
        except OSError:
            pass
        deadline = time.monotonic() + self.config.api.shutdown_grace_secs
        dispatcher = server.task_dispatcher
        while time.monotonic() < deadline:
            pending_output = any(getattr(ch, "total_outbufs_len", 0) for ch in list(server._map.values()))
            if not dispatcher.active_count and not dispatcher.queue and not pending_output:
                break
            wasyncore.loop(timeout=0.05, map=server._map, use_poll=True, count=1)
        for channel in list(server._map.values()):
            try:
                channel.close()
            except OSError:
                pass
        dispatcher.shutdown(cancel_pending=True, timeout=2)
        kernel.close()
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
        for channel in list(self.server._map.values()):
            try:
                channel.close()
            except OSError:
                pass
        self.server.task_dispatcher.shutdown(cancel_pending=True, timeout=2)
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
    # PostgreSQL when the config names one (`database`, set by the shared-database work).
    database = getattr(config, "database", None)
    if database is None:
        return open_store(config.db_path)
    store = open_store(config.db_path, database)
    if store.backend != "sqlite":
        log.info("database: %s %s", store.backend, store.where)  # `where` is masked (as Kernel.open)
    return store


def tune_interpreter() -> None:
    """The process-wide interpreter settings a busy threaded daemon wants."""
    # The GIL switch interval: Python's own 5 ms unless AGENTD_SWITCH_INTERVAL sets it. A
    # shorter one hands the GIL (and the locks waiting on it) between threads sooner, at the
    # price of more context switches per request (README, Performance, has the A/B runs).
    sys.setswitchinterval(SWITCH_INTERVAL)
    gc.set_threshold(*GC_THRESHOLD)


def run_daemon(config: Config) -> None:
    """`agentd start`: raises StartError (or another AgentdError) if it cannot start."""
    setup_logging(config.log_level)
    tune_interpreter()
    daemon = Daemon(config)
    try:
        daemon.start()
        daemon.serve()
    finally:
        daemon.release_home()
