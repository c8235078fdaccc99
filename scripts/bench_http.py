#!/usr/bin/env python3
"""HTTP shell benchmark: agentd's GET /api/health next to a bare Flask+waitress app.

Prints requests/s and p50/p99 latency at 1, 8 and 32 concurrent keep-alive
clients for both servers, the agentd/bare ratio, agentd's cold start (spawn to
first healthy answer) and its idle RSS. Figures only; nothing is asserted.

    python scripts/bench_http.py [--seconds 3] [--starts 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import Daemon, free_port, make_home  # noqa: E402

BARE_APP = textwrap.dedent("""
    import sys
    from flask import Flask, jsonify
    import waitress
    app = Flask("bare")

    @app.get("/api/health")
    def health():
        return jsonify({"status": "ok"})

    waitress.serve(app, host="127.0.0.1", port=int(sys.argv[1]), threads=64,
                   connection_limit=1000, asyncore_use_poll=True, _quiet=True)
""")


def wait_up(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"{url} never came up")


def load(url: str, clients: int, seconds: float) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) with `clients` keep-alive sessions."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop_at = time.perf_counter() + seconds
    barrier = threading.Barrier(clients)

    def worker(i: int) -> None:
        session = requests.Session()
        session.get(url)  # open the connection before timing
        barrier.wait()
        own = latencies[i]
        while True:
            start = time.perf_counter()
            if start >= stop_at:
                return
            response = session.get(url)
            own.append(time.perf_counter() - start)
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    merged = sorted(x for own in latencies for x in own)
    rps = len(merged) / elapsed
    p50 = merged[len(merged) // 2] * 1000
    p99 = merged[min(len(merged) - 1, int(len(merged) * 0.99))] * 1000
    return rps, p50, p99


def cold_start(starts: int) -> tuple[list[float], float]:
    """Seconds from spawning `agentd start` to the first healthy answer; idle RSS in MB."""
    times: list[float] = []
    rss_mb = 0.0
    for _ in range(starts):
        with tempfile.TemporaryDirectory() as tmp:
            daemon = Daemon(make_home(Path(tmp)))
            began = time.perf_counter()
            daemon.start(wait=False)
            while True:
                try:
                    if requests.get(f"{daemon.url}/api/health", timeout=0.5).ok:
                        break
                except requests.RequestException:
                    time.sleep(0.002)
            times.append(time.perf_counter() - began)
            time.sleep(1.0)
            with open(f"/proc/{daemon.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss_mb = int(line.split()[1]) / 1024
            daemon.stop()
    return times, rss_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        agentd = Daemon(make_home(Path(tmp))).start()
        bare_port = free_port()
        bare = subprocess.Popen([sys.executable, "-c", BARE_APP, str(bare_port)])
        try:
            bare_url = f"http://127.0.0.1:{bare_port}/api/health"
            wait_up(bare_url)
            print(f"{'clients':>7} | {'agentd req/s':>12} {'p50 ms':>7} {'p99 ms':>7} | "
                  f"{'bare req/s':>10} {'p50 ms':>7} {'p99 ms':>7} | ratio")
            for clients in (1, 8, 32):
                a = load(f"{agentd.url}/api/health", clients, args.seconds)
                b = load(bare_url, clients, args.seconds)
                print(f"{clients:>7} | {a[0]:>12.0f} {a[1]:>7.2f} {a[2]:>7.2f} | "
                      f"{b[0]:>10.0f} {b[1]:>7.2f} {b[2]:>7.2f} | {a[0] / b[0]:.2f}")
        finally:
            bare.terminate()
            bare.wait(10)
            agentd.stop()

    times, rss = cold_start(args.starts)
    print(f"cold start to first healthy answer: median {statistics.median(times) * 1000:.0f} ms "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, n={len(times)})")
    print(f"idle RSS after start: {rss:.1f} MB")


if __name__ == "__main__":
    main()
