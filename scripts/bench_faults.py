"""What a client sees when the provider misbehaves: status, time to answer, daemon threads.

Starts a daemon (`[llm] timeout_secs = 3`, `stream_idle_secs = 2`, `retries = 3`, the
settings of the issue's measurements) and tests/misbehaving_upstream.py, then for each
fault prints the status the client got, the time until its answer (or, for stop and
disconnect rows, until the upstream connection was closed), and the daemon's thread
count before and after (after = once it has settled, at most 5 s later). A healthy
provider is the reference row. Prints figures only; asserts nothing.

    python scripts/bench_faults.py
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import benchlib  # noqa: F401  (puts tests/ on sys.path)
from conftest import LLM_ENV
from misbehaving_upstream import Upstream
from support import Daemon, make_home
from tests.llm.test_faults import settle, spawn, sse, sse_open, threads, v1_open

CONFIG = ("[api]\nrate_limit_per_second = 100000\nrate_limit_burst = 100000\nshutdown_grace_secs = 5\n"
          "threads = 256\nmax_streams = 220\n"
          "\n[llm]\ntimeout_secs = 3\nstream_idle_secs = 2\nretries = 3\n\n[agents]\nmax_queue = 8\n"
          "\n[memory]\nauto_remember = false\n")  # no embedding-model threads appearing mid-count


def row(label: str, status: object, seconds: float, before: int, after: int) -> None:
    print(f"{label:<50} {str(status):<22} {seconds:>8.2f} s {before:>8} {after:>7}")


def plain(d: Daemon, up: Upstream, fault: str, anthropic: bool = False) -> None:
    agent_id, _ = spawn(d, up, fault, anthropic)
    before = threads(d)
    started = time.monotonic()
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": "hi"}, timeout=120)
    elapsed = time.monotonic() - started
    extra = f" RA={r.headers['Retry-After']}" if "Retry-After" in r.headers else ""
    row(f"POST /message, {fault}", f"{r.status_code}{extra}", elapsed, before, settle(d, before))


def streamed(d: Daemon, up: Upstream, fault: str, anthropic: bool = False) -> None:
    agent_id, _ = spawn(d, up, fault, anthropic)
    before = threads(d)
    started = time.monotonic()
    events = list(sse(sse_open(d, agent_id, "hi")))
    elapsed = time.monotonic() - started
    last = events[-1]
    status = f"error {last[2]['status']}" if last[1] == "error" else last[1]
    chunks = sum(1 for e in events if e[1] == "chunk")
    label = f"SSE, {fault}{' (anthropic)' if anthropic else ''}"
    row(label, f"{status}, {chunks} chunks", elapsed, before, settle(d, before))


def first_token(d: Daemon, up: Upstream, fault: str) -> None:
    agent_id, _ = spawn(d, up, fault)
    before = threads(d)
    start = len(up.by_fault(fault))
    arrivals = [at for at, event, _ in sse(sse_open(d, agent_id, "hi")) if event == "chunk"]
    sent = [t for t, _ in up.by_fault(fault)[start].sent]
    delays = ", ".join(f"{(a - s) * 1000:.1f}" for a, s in zip(arrivals, sent))
    row(f"SSE, {fault}: ms upstream->client", delays, arrivals[-1] - sent[0], before, settle(d, before))


def stopped(d: Daemon, up: Upstream, how: str) -> None:
    fault = f"hang-{how}"
    agent_id, name = spawn(d, up, fault)
    before = threads(d)
    client = sse_open(d, agent_id, "wait") if how != "v1-client" else v1_open(d, name, "wait")
    conn = up.wait_conns(fault, 1)[0]
    at = time.time()
    if how == "stop":
        status = d.post(f"/api/agents/{agent_id}/stop").status_code
    elif how == "delete":
        status = d.delete(f"/api/agents/{agent_id}").status_code
    else:
        client.close()
        status = "client gone"
    conn.done.wait(10)
    client.close()
    row(f"hang, then {how}: until upstream closed", status, conn.closed_at - at, before, settle(d, before))


def stuck(d: Daemon, up: Upstream) -> None:
    fault = "hang-stuck"
    agent_id, _ = spawn(d, up, fault)
    healthy, _ = spawn(d, up, "ok")
    before = threads(d)
    pool = ThreadPoolExecutor(200)
    started = time.monotonic()
    futures = [pool.submit(d.post, f"/api/agents/{agent_id}/message", json={"message": str(i)}, timeout=60)
               for i in range(200)]
    time.sleep(2)
    done = [f.result() for f in futures if f.done()]
    codes = sorted({r.status_code for r in done})
    health, others = [], []
    for _ in range(30):
        t = time.perf_counter()
        d.get("/api/health")
        health.append(time.perf_counter() - t)
        t = time.perf_counter()
        d.post(f"/api/agents/{healthy}/message", json={"message": "hi"})
        others.append(time.perf_counter() - t)
    during = threads(d)
    d.delete(f"/api/agents/{agent_id}")
    for f in futures:
        f.result()
    pool.shutdown()
    row("200 requests to one hanging agent", f"{len(done)} refused {codes}", time.monotonic() - started,
        before, settle(d, before))
    print(f"    while stuck: threads {during}, GET /api/health p50 {statistics.median(health) * 1000:.1f} ms, "
          f"message to another agent p50 {statistics.median(others) * 1000:.1f} ms")


def main() -> None:
    up = Upstream().start()
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(make_home(Path(tmp), CONFIG), env_extra=LLM_ENV).start()
        try:
            warm, _ = spawn(d, up, "ok")  # warm the pools before counting threads
            d.post(f"/api/agents/{warm}/message", json={"message": "hi"})
            print(f"{'fault':<50} {'client got':<22} {'time':>10} {'threads':>8} {'after':>7}")
            plain(d, up, "ok")
            streamed(d, up, "ok")
            for fault in ("hang", "drip", "status-429-1", "status-503-1", "reset"):
                plain(d, up, fault)
            for fault, anthropic in (("drip", False), ("stall", False), ("cut", False), ("cut", True)):
                streamed(d, up, fault, anthropic)
            first_token(d, up, "close-1.0-2")
            first_token(d, up, "chunked-1.0-2")
            for how in ("stop", "delete", "client", "v1-client"):
                stopped(d, up, how)
            stuck(d, up)
            agent_id, _ = spawn(d, up, "hang-shutdown")
            client = sse_open(d, agent_id, "wait")
            conn = up.wait_conns("hang-shutdown", 1)[0]
            at = time.time()
            d.proc.terminate()
            conn.done.wait(10)
            code = d.proc.wait(15)
            client.close()
            row("hang, then daemon shutdown: until closed", f"exit {code}", conn.closed_at - at, 0, 0)
        finally:
            d.stop()
            up.stop()


if __name__ == "__main__":
    threading.excepthook = lambda args: None
    main()
