"""Shared pieces of the benchmarks: the fake LLM in its own process, a daemon, load loops.

The benchmarks print figures only; nothing here asserts on time.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import FAST_API, Daemon, free_port, make_home  # noqa: E402

__all__ = ["ROOT", "FAST_API", "Daemon", "free_port", "make_home", "fake_llm", "fast_upstream", "bench_daemon",
           "timed_loop", "send_messages", "rss_mb", "rss_parts", "open_files", "cpu_seconds", "wait_quiet", "summary",
           "percentile"]


@contextmanager
def fake_llm() -> Iterator[str]:
    """The fake LLM in a separate process (so it does not share our GIL); yields its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fakellm.py"), "--port", str(port),
                             "--max-log", "100"], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def fast_upstream(delay_ms: float = 0.0, cpu: str | None = None) -> Iterator[str]:
    """scripts/fast_upstream.py (canned answers, faster than the fake LLM) in its own process,
    pinned to `cpu` when given and taskset exists; yields its base URL (`.../v1`)."""
    cmd = [sys.executable, str(ROOT / "scripts" / "fast_upstream.py"), "--delay-ms", str(delay_ms)]
    if cpu and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu] + cmd
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def bench_daemon(fake_url: str, api_extra: str = "", env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """A daemon in a temp home whose default model is gpt-4o on the fake LLM.

    `api_extra`: more `key = value` lines for the `[api]` table.
    """
    with tempfile.TemporaryDirectory() as tmp:
        config = (FAST_API + api_extra + '\n[default_model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
                  f'api_key_env = "OPENAI_API_KEY"\n[provider_urls]\nopenai = "{fake_url}/v1"\n')
        daemon = Daemon(make_home(Path(tmp), config), env_extra={"OPENAI_API_KEY": "bench", **(env or {})}).start()
        try:
            yield daemon
        finally:
            daemon.stop()


def timed_loop(fn: Callable[[int], object], clients: int, seconds: float,
               between: Callable[[int, int], object] | None = None) -> list[float]:
    """Run fn(client_index) in `clients` threads for `seconds`; every call's latency in seconds.

    `between(client_index, calls_so_far)`, when given, runs before each call, untimed.
    """
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop_at = time.perf_counter() + seconds
    barrier = threading.Barrier(clients)

    def worker(i: int) -> None:
        fn(i)  # warm the connection
        barrier.wait()
        while time.perf_counter() < stop_at:
            if between is not None:
                between(i, len(latencies[i]))
            start = time.perf_counter()
            fn(i)
            latencies[i].append(time.perf_counter() - start)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for own in latencies for x in own]


def send_messages(base: str, ids: list[str], count: int, conns: int, first: int = 0,
                  text: Callable[[int], str] = lambda k: "hello", timeout: float = 120) -> int:
    """POST messages first .. first+count-1 from `conns` threads, message k to agent
    ids[k % len(ids)] with the text text(k); how many were not answered 200."""
    lock = threading.Lock()
    state = {"next": first, "bad": 0}

    def worker() -> None:
        s = requests.Session()
        while True:
            with lock:
                k = state["next"]
                if k >= first + count:
                    return
                state["next"] = k + 1
            try:
                ok = s.post(f"{base}/api/agents/{ids[k % len(ids)]}/message", json={"message": text(k)},
                            timeout=timeout).status_code == 200
            except requests.RequestException:
                ok = False
            if not ok:
                with lock:
                    state["bad"] += 1

    threads = [threading.Thread(target=worker) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return state["bad"]


def rss_mb(pid: int) -> float:
    """The process's resident set, in MB."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def rss_parts(pid: int) -> dict[str, float]:
    """The resident set in MB by kind: `anon` (RssAnon: heap, arenas, mapped blocks), `file`
    (RssFile: the program, libraries, mapped files) and, from /proc/PID/smaps, `heap` (glibc's
    main heap) and `other_anon` (every other anonymous mapping: arenas, large blocks, stacks)."""
    parts = {"anon": 0.0, "file": 0.0, "heap": 0.0, "other_anon": 0.0}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("RssAnon:", "RssFile:")):
                parts["anon" if line.startswith("RssAnon") else "file"] = int(line.split()[1]) / 1024
    kind = None
    with open(f"/proc/{pid}/smaps") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                name = head[5] if len(head) > 5 else ""
                kind = "heap" if name == "[heap]" else "other_anon" if not name else None
            elif head[0] == "Rss:" and kind is not None:
                parts[kind] += int(head[1]) / 1024
    return parts


def open_files(pid: int, path: Path) -> int:
    """How many of the process's descriptors are open on `path` (for a SQLite database: its
    connections)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd) == str(path)
        except OSError:
            pass
    return count


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_quiet(pid: int, timeout: float = 60.0) -> None:
    """Until the process uses under 5 % of a core over 0.2 s (its background work is done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        time.sleep(0.2)
        if cpu_seconds(pid) - before < 0.01:
            return


def summary(latencies: list[float], seconds: float) -> tuple[float, float]:
    """(calls per second, p50 in ms)."""
    return len(latencies) / seconds, statistics.median(latencies) * 1000


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
