"""Run the daemon in the foreground: kernel + Flask app on waitress, daemon.json,
signals and a graceful shutdown.

We drive waitress's event loop ourselves (one poll at a time) instead of calling
`server.run()`, so that shutdown can stop accepting, keep flushing in-flight
responses for a bounded time, and only then close everything.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

import waitress
from waitress import wasyncore

from agentd.api import create_app
from agentd.api.ws_transport import close_websockets, install as install_ws_transport
from agentd.client import DaemonInfo, is_healthy, read_daemon_file, write_daemon_file
from agentd.config import Config
from agentd.errors import AgentdError
from agentd.kernel import Kernel
from agentd.kernel_time import iso, utcnow
from agentd.providers import load_secrets

SWITCH_INTERVAL = float(os.environ.get("AGENTD_SWITCH_INTERVAL", "0.0005"))
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


class Daemon:
    """One running daemon: owns the kernel, the waitress server and daemon.json."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = threading.Event()
        self.kernel: Kernel | None = None
        self.server = None

    def _pool_stats(self) -> dict[str, int]:
        dispatcher = self.server.task_dispatcher if self.server is not None else None
        if dispatcher is None:
            return {}
        return {"threads": len(dispatcher.threads), "busy": dispatcher.active_count,
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
            os._exit(1)
        log.info("%s received: shutting down", signal.Signals(signum).name)
        # Only set the flag: the poll loop wakes within its short timeout.
        self._stop.set()

    def start(self) -> None:
        """Open the kernel, bind the port, write daemon.json."""
        cfg = self.config
        check_not_running(cfg)
        # Keys saved through the API come back; the real environment wins.
        load_secrets(cfg.secrets_path)
        self.kernel = Kernel.open(cfg)
        self.kernel.set_shutdown_hook(self.request_stop)
        app = create_app(self.kernel, self._pool_stats)
        host, port = cfg.host, cfg.port
        try:
            self.server = waitress.create_server(
                app, host=host, port=port, threads=cfg.api.threads,
                connection_limit=max(1000, cfg.api.threads * 4), asyncore_use_poll=True,
                channel_timeout=300, ident="agentd",
                # waitress would strip X-Forwarded-* before agentd.api.proxy can judge
                # them; that layer strips them itself for untrusted peers.
                clear_untrusted_proxy_headers=not cfg.api.trusted_proxies,
                # Keep reading while a request runs, so waitress notices a client that left
                # (environ["waitress.client_disconnected"]) and its run can be withdrawn.
                channel_request_lookahead=1)
        except OSError as exc:
            self.kernel.close()
            if exc.errno == errno.EADDRINUSE:
                raise StartError(f"address {host}:{port} is already in use") from None
            raise StartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        install_ws_transport(self.server)
        listen = f"{host}:{self.server.effective_port}"
        write_daemon_file(cfg.daemon_file, DaemonInfo(listen, os.getpid(), iso(utcnow())))
        log.info("agentd listening on http://%s (home %s)", listen, cfg.home)

    def serve(self) -> None:
        """Run until a signal or POST /api/shutdown, then shut down gracefully."""
        server = self.server
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self._stop.is_set():
                wasyncore.loop(timeout=0.2, map=server._map, use_poll=True, count=1)
        finally:
            self._drain()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _drain(self) -> None:
        server, kernel = self.server, self.kernel
        kernel.stopping.set()
        # Stop means stop: runs end now and their provider connections close at once,
        # so the grace period below only has to flush answers.
        kernel.agents.stop_all()
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
        info = read_daemon_file(self.config.daemon_file)
        if info is not None and info.pid == os.getpid():
            self.config.daemon_file.unlink(missing_ok=True)
        log.info("agentd stopped")


def run_daemon(config: Config) -> None:
    """`agentd start`: raises StartError (or another AgentdError) if it cannot start."""
    setup_logging(config.log_level)
    # Many short critical sections (SQLite write lock, queues) are handed between threads;
    # the default 5 ms GIL switch interval turns that into lock convoys under load.
    sys.setswitchinterval(SWITCH_INTERVAL)
    daemon = Daemon(config)
    daemon.start()
    daemon.serve()
