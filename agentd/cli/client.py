"""How the CLI finds and talks to a running daemon (via `daemon.json`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentd.config import Config

if TYPE_CHECKING:  # requests loads on first use: `agentd start` answers its first probe sooner
    import requests

HEALTH_TIMEOUT = 2.0


@dataclass
class DaemonInfo:
    """Contents of daemon.json.

    `process` tells the daemon's own process from a later one that was given the same pid:
    the kernel's boot id and the process's start time in clock ticks since boot (field 22 of
    /proc/<pid>/stat), which together name one process for good. Empty where there is no /proc."""

    listen_addr: str
    pid: int
    started_at: str
    process: str = ""

    @property
    def base_url(self) -> str:
        host, _, port = self.listen_addr.rpartition(":")
        # A daemon bound to every interface is reached through loopback.
        if host in ("0.0.0.0", "[::]", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{port}"


def read_daemon_file(path: Path) -> DaemonInfo | None:
    """Parse daemon.json; None when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return DaemonInfo(str(data["listen_addr"]), int(data["pid"]), str(data.get("started_at", "")),
                          str(data.get("process", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_daemon_file(path: Path, info: DaemonInfo) -> None:
    """Write daemon.json atomically with mode 0600."""
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"listen_addr": info.listen_addr, "pid": info.pid,
                   "started_at": info.started_at, "process": info.process}, fh, indent=2)
    os.replace(tmp, path)


def process_identity(pid: int) -> str:
    """`<boot id>/<start ticks>` of process `pid`; "" when it does not exist or there is no /proc."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: count from its closing one.
    fields = stat[stat.rfind(")") + 2:].split()
    return f"{boot}/{fields[19]}" if len(fields) > 19 else ""


def is_healthy(base_url: str, timeout: float = HEALTH_TIMEOUT) -> bool:
    """True when GET /api/health answers 2xx within `timeout` seconds."""
    import requests

    try:
        response = requests.get(f"{base_url}/api/health", timeout=(min(1.0, timeout), timeout))
        return response.ok
    except requests.RequestException:
        return False


def find_daemon(config: Config, timeout: float = HEALTH_TIMEOUT) -> DaemonInfo | None:
    """The live daemon named by daemon.json (answering within `timeout` s), or None."""
    info = read_daemon_file(config.daemon_file)
    if info is not None and is_healthy(info.base_url, timeout):
        return info
    return None


class ApiClient:
    """Small authenticated client for the daemon's API."""

    def __init__(self, base_url: str, api_key: str = "", timeout: float = 120.0) -> None:
        import requests

        self.base_url = base_url.rstrip("/")
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout)
        return self.session.request(method, f"{self.base_url}{path}", **kwargs)
