"""The daemon's one asyncio loop for MCP: the client connections and the `/mcp` server
run on it. Started on first use, so a daemon without MCP does not import asyncio."""

from __future__ import annotations

import threading
from typing import Any, Coroutine


class LoopThread:
    """An asyncio event loop on its own daemon thread; `submit` runs a coroutine there."""

    def __init__(self, name: str = "agentd-mcp") -> None:
        self.name = name
        self._loop: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> Any:
        with self._lock:
            if self._loop is None:
                import asyncio

                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True)
                self._thread.start()
            return self._loop

    @property
    def running(self) -> bool:
        return self._loop is not None

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """A `concurrent.futures.Future` of the coroutine's result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
