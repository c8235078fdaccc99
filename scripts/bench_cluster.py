"""What the cluster coordination costs per agent run (agentd/cluster/coordinator.py).

Every run takes its session's lease, writes a run record (one transaction) and closes both
(a second transaction). This measures that bookkeeping around an empty run body, next to
the reference of the same loop holding only a threading.Lock (what a run cost before), on
SQLite and, when `--pg URL` is given (e.g. postgresql://postgres@127.0.0.1:5432/bench, an
existing empty database), on PostgreSQL. Prints figures and ratios; asserts nothing.

    python scripts/bench_cluster.py [--runs 300] [--pg URL]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's agentd

from agentd.cluster.coordinator import Cluster
from agentd.cluster.config import ClusterSettings
from agentd.store import open_store


def per_run_ms(fn, runs: int) -> float:
    for _ in range(20):
        fn()
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - start) / runs * 1000


def measure(store, label: str, runs: int) -> None:
    cluster = Cluster(store, ClusterSettings(f"bench-{label}"), "127.0.0.1:0")
    handle = SimpleNamespace(id="agent", name="bench", session_id=f"session-{time.time()}", killed=False)
    cancel = threading.Event()
    lock = threading.Lock()

    def reference() -> None:
        with lock:
            pass

    base = per_run_ms(reference, runs)
    coordinated = per_run_ms(lambda: cluster.run(handle, cancel, None, lambda: None), runs)
    print(f"{label:10s} lock only {base:8.4f} ms/run   lease + run record {coordinated:7.3f} ms/run   "
          f"added {coordinated - base:6.3f} ms/run")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--pg", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "bench.db")
        measure(store, "sqlite", args.runs)
        store.close()
        if args.pg:
            from agentd.store.backend import parse_database_url

            pg = open_store(Path(tmp) / "unused.db", parse_database_url(args.pg, "--pg", allow_password=True))
            measure(pg, "postgres", args.runs)
            pg.close()


if __name__ == "__main__":
    main()
