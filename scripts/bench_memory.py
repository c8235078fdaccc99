"""Semantic memory benchmark: model load, remember/s, recall p50 at 10k and 100k fragments,
and the daemon's RSS before and after memory is first used.

    python scripts/bench_memory.py [--sizes 10000,100000] [--queries 200]

Recall is timed end to end through `SemanticMemory.recall` (query embedding, filter, exact
cosine top-k, reading the winners from SQLite and updating their access counts) for one
agent. The store is filled with 2,000 embedded sentences plus noisy copies of their vectors
(recall cost does not depend on what the vectors say; embedding 100k texts would take
minutes). The query embedding alone and the matrix product alone are printed next to it.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import ROOT, bench_daemon, fake_llm  # noqa: E402

SUBJECTS = ["The user", "My manager", "Alice", "The build server", "Our team", "The customer", "Bob", "The database",
            "The marketing lead", "The new intern", "The payment service", "My neighbour"]
VERBS = ["prefers", "dislikes", "depends on", "wrote about", "asked for", "maintains", "forgot", "mentioned",
         "is allergic to", "recommended", "scheduled", "replaced"]
OBJECTS = ["green tea", "the quarterly report", "PostgreSQL backups", "a trip to Lisbon", "the violin lessons",
           "dark mode", "the login page", "weekly standups", "a vegetarian menu", "the staging cluster",
           "Python type hints", "the office plants", "a faster laptop", "the holiday schedule", "invoice 4411"]
WHEN = ["on Mondays", "last week", "every morning", "since March", "after lunch", "before the release", "", ""]


def sentences(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    seen: set[str] = set()
    while len(seen) < n:
        seen.add(f"{rnd.choice(SUBJECTS)} {rnd.choice(VERBS)} {rnd.choice(OBJECTS)} {rnd.choice(WHEN)}".strip()
                 + f" (note {len(seen)})")
    return sorted(seen)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def min_ms(values: list[float]) -> float:
    return min(values) * 1000


def model_load() -> None:
    code = ("import time; t=time.perf_counter(); from agentd.memory.embedder import LocalEmbedder; e=LocalEmbedder();"
            "e.load(); print(time.perf_counter()-t, e.load_seconds)")
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        runs.append([float(x) for x in out.stdout.split()])
    best = min(runs)
    print(f"model load (fresh process, import + sha256 check + session): best {best[0] * 1000:.0f} ms "
          f"of 3 (median {statistics.median(r[0] for r in runs) * 1000:.0f} ms)")


def fill(memory, agent: str, total: int, base_vectors, base_texts) -> None:  # type: ignore[no-untyped-def]
    import numpy as np
    from pony import orm

    rnd = np.random.default_rng(7)
    now = datetime.now(timezone.utc)
    rows = []
    for i in range(total):
        j = i % len(base_texts)
        vector = base_vectors[j] + rnd.normal(0, 0.05, base_vectors.shape[1]).astype(np.float32)
        vector /= np.linalg.norm(vector)
        created = str(now - timedelta(seconds=total - i))
        rows.append((agent, str(uuid.uuid4()), f"{base_texts[j]} #{i}", vector.astype("<f4").tobytes(),
                     memory.embedder.name, "{}", "user_provided", "semantic", 1.0, created, created, 0))
    with orm.db_session:
        conn = memory.store.db.get_connection()
        conn.executemany(
            "INSERT INTO memory_fragments (agent_id, id, content, embedding, model, metadata, source, scope, "
            "confidence, created_at, accessed_at, access_count) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)


def recall_bench(sizes: list[int], queries: int) -> None:
    import numpy as np

    from agentd.memory.embedder import LocalEmbedder
    from agentd.memory.semantic import SemanticMemory
    from agentd.store import open_store

    embedder = LocalEmbedder()
    embedder.load()
    texts = sentences(2000, 1)
    t0 = time.perf_counter()
    vectors = embedder.embed(texts)
    print(f"batch embedding: {len(texts) / (time.perf_counter() - t0):.0f} sentences/s")
    asks = sentences(queries, 99)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "bench.db")
        memory = SemanticMemory(store, lambda: embedder)

        # remember/s: real writes (embedding, dedup search, insert) into a fresh agent.
        fresh = sentences(300, 5)
        t0 = time.perf_counter()
        merged = sum(memory.remember("writer", s)["merged"] for s in fresh)
        rate = len(fresh) / (time.perf_counter() - t0)
        print(f"remember: {rate:.0f} fragments/s ({len(fresh)} sentences, {merged} merged as duplicates)")

        embed_only = []
        for q in asks:
            t0 = time.perf_counter()
            embedder.embed([q])
            embed_only.append(time.perf_counter() - t0)
        print(f"query embedding alone: p50 {p50_ms(embed_only):.2f} ms (fastest {min_ms(embed_only):.2f} ms)")

        done = 0
        for size in sizes:
            fill(memory, "reader", size - done, vectors, texts)
            done = size
            memory._indexes.pop("reader", None)
            t0 = time.perf_counter()
            index = memory.index("reader")
            rebuild = time.perf_counter() - t0
            q = vectors[0]
            products = []
            for _ in range(50):
                t0 = time.perf_counter()
                index.search(q, 5)
                products.append(time.perf_counter() - t0)
            timings = []
            for text in asks:
                t0 = time.perf_counter()
                found = memory.recall("reader", text, limit=5)
                timings.append(time.perf_counter() - t0)
                assert found
            filtered = []
            for text in asks[:50]:
                t0 = time.perf_counter()
                memory.recall("reader", text, limit=5, flt=_filter())
                filtered.append(time.perf_counter() - t0)
            print(f"recall at {size:>7,} fragments: p50 {p50_ms(timings):.2f} ms (fastest {min_ms(timings):.2f} ms), p90 "
                  f"{sorted(timings)[int(len(timings) * 0.9)] * 1000:.2f} ms (embedding {p50_ms(embed_only):.2f} ms "
                  f"+ top-k {p50_ms(products):.2f} ms + rows/access update); with source+min_confidence+after "
                  f"filter p50 {p50_ms(filtered):.2f} ms; index rebuild from the store {rebuild * 1000:.0f} ms, "
                  f"matrix {index.vectors[:len(index)].nbytes / 2**20:.0f} MiB")
        del np


def _filter():  # type: ignore[no-untyped-def]
    from agentd.memory.fields import MemoryFilter

    return MemoryFilter(source="user_provided", min_confidence=0.5,
                        after=(datetime.now(timezone.utc) - timedelta(days=1)).timestamp())


def daemon_rss() -> None:
    with fake_llm() as url, bench_daemon(url) as d:
        pid = d.daemon_file()["pid"]
        time.sleep(1.0)
        idle = rss_kb(pid)
        r = d.post("/api/agents", json={"manifest_toml": 'name = "rss"\n'})
        agent = r.json()["agent_id"]
        for _ in range(3):
            d.get("/api/status")
        time.sleep(0.5)
        still = rss_kb(pid)
        t0 = time.perf_counter()
        r = d.post(f"/api/memory/agents/{agent}/memories", json={"content": "The first fragment loads the model"})
        first = time.perf_counter() - t0
        after = rss_kb(pid)
        t0 = time.perf_counter()
        d.post(f"/api/memory/agents/{agent}/memories", json={"content": "A second fragment, model already loaded"})
        second = time.perf_counter() - t0
        loaded = "onnxruntime" in Path(f"/proc/{pid}/maps").read_text()
        print(f"daemon RSS: idle {idle / 1024:.1f} MiB, after spawning an agent {still / 1024:.1f} MiB, after the "
              f"first remember {after / 1024:.1f} MiB (+{(after - idle) / 1024:.1f} MiB; onnxruntime mapped: {loaded})")
        print(f"first POST .../memories (loads numpy + model) {first * 1000:.0f} ms, second {second * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--skip-daemon", action="store_true")
    args = parser.parse_args()
    from agentd.memory.embedder import import_numpy

    import_numpy()  # single-threaded BLAS, as in the daemon
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (figures scale with it)")
    model_load()
    recall_bench([int(s) for s in args.sizes.split(",")], args.queries)
    if not args.skip_daemon:
        daemon_rss()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
