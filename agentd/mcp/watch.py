"""Hot reload of `[[mcp_servers]]`: the config file is checked every `interval` seconds
(its modification time and size, one `stat`), and a change is applied to the hub once the
file has stayed the same for one more look. A file that no longer parses leaves the running
servers as they are and is logged."""

from __future__ import annotations

import logging
import threading
import tomllib
from pathlib import Path
from typing import Callable

from agentd import tomlsafe
from agentd.errors import ConfigError
from agentd.mcp.config import McpServerSpec, parse_mcp_servers

log = logging.getLogger("agentd.mcp")


def read_specs(path: Path) -> list[McpServerSpec]:
    """The `[[mcp_servers]]` of the file at `path` (none when it is absent); ConfigError otherwise."""
    if not path.exists():
        return []
    try:
        data = tomlsafe.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    return parse_mcp_servers(data)


class ConfigWatch:
    """Calls `apply(specs)` when the file's `[[mcp_servers]]` may have changed."""

    def __init__(self, path: Path, apply: Callable[[list[McpServerSpec]], object], interval: float = 1.0) -> None:
        self.path = path
        self.apply = apply
        self.interval = interval
        self._seen = self._looked = self._signature()  # the file applied; the file at the last look
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _signature(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="agentd-mcp-config", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def check(self) -> bool:
        """Apply the file if it changed and has stayed the same since the last look; True
        when it was applied. (An editor or a script that writes the file in place leaves it
        empty or half written for a moment, one that replaces it leaves no file: either reads as
        a file with fewer servers, which would be stopped and started again at the next look.)"""
        seen = self._signature()
        settled, self._looked = seen == self._looked, seen
        if seen == self._seen or not settled:
            return False
        return self.reload()

    def reload(self) -> bool:
        try:
            self.reload_now()
        except ConfigError as exc:
            log.error("MCP servers not reloaded: %s", exc.message)
            return False
        return True

    def reload_now(self) -> object:
        """Apply the file now (POST /api/mcp/reload); ConfigError when it cannot be used."""
        self._seen = self._signature()
        return self.apply(read_specs(self.path))

    def close(self) -> None:
        self._stop.set()
