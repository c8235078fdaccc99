"""The daemon's waitress server: bound with agentd's dispatcher, channels and tasks, its
loop turned one poll at a time by the daemon, and drained on shutdown.

The daemon drives waitress's event loop itself (`poll`) instead of calling
`server.run()`, so that shutdown can stop accepting, keep flushing in-flight responses
for a bounded time, and only then close everything (`drain`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import waitress
from waitress import wasyncore

from agentd.config import Config
from agentd.server.dispatcher import LifoTaskDispatcher
from agentd.server.early_refusal import install as install_early_refusal
from agentd.server.websocket import close_websockets, install as install_websockets


def listen(config: Config, app: Callable[..., Any]) -> Any:
    """Bind `config`'s address and serve `app` on it (OSError when the address is not free)."""
    threads = config.api.threads
    dispatcher = LifoTaskDispatcher()
    server = waitress.create_server(
        app, host=config.host, port=config.port, threads=threads, _dispatcher=dispatcher,
        connection_limit=max(1000, threads * 4), asyncore_use_poll=True,
        channel_timeout=300, ident="agentd",
        # waitress would strip X-Forwarded-* before agentd.server.proxy can judge
        # them; that layer strips them itself for untrusted peers.
        clear_untrusted_proxy_headers=not config.api.trusted_proxies)
    # (No channel_request_lookahead: task.peer_left tells a run that its client left
    # without waitress's loop polling every busy channel.)
    # waitress starts the threads of its own dispatcher only; `threads=` still sizes the
    # channel limits above.
    dispatcher.set_thread_count(threads)
    install_websockets(server)
    install_early_refusal(server, config)  # cross-site / foreign-Host bodies never read
    return server


def pool_stats(server: Any) -> dict[str, int]:
    """The worker pool: its size, threads started so far, busy ones and queued tasks."""
    dispatcher = server.task_dispatcher if server is not None else None
    if dispatcher is None:
        return {}
    return {"threads": dispatcher.limit,
            "started": len(dispatcher.threads), "busy": dispatcher.active_count,
            "queued": len(dispatcher.queue)}


def poll(server: Any, timeout: float) -> None:
    """One turn of the server's loop."""
    wasyncore.loop(timeout=timeout, map=server._map, use_poll=True, count=1)


def wake(server: Any) -> None:
    """End the loop's current wait (from any thread)."""
    try:
        server.trigger.pull_trigger()
    except OSError:
        pass


def drain(server: Any, grace_secs: float) -> None:
    """Stop accepting, let in-flight answers finish for up to `grace_secs`, close all."""
    # Close only the listening socket: the trigger and the open channels stay, so
    # in-flight responses are still flushed.
    try:
        wasyncore.dispatcher.close(server)
    except OSError:
        pass
    deadline = time.monotonic() + grace_secs
    dispatcher = server.task_dispatcher
    while time.monotonic() < deadline:
        pending_output = any(getattr(ch, "total_outbufs_len", 0) for ch in list(server._map.values()))
        if not dispatcher.active_count and not dispatcher.queue and not pending_output:
            break
        poll(server, 0.05)
    # The app's WebSocket handlers end by themselves (going away once their runs' ends are
    # sent); one still held by its client is told "going away" here, which frees its worker.
    close_websockets(server)
    close(server)


def close(server: Any) -> None:
    """Close every connection and stop the worker threads."""
    for channel in list(server._map.values()):
        try:
            channel.close()
        except OSError:
            pass
    server.task_dispatcher.shutdown(cancel_pending=True, timeout=2)
