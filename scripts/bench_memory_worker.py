#!/usr/bin/env python3
"""CPU per exchange of the auto-remember worker's store, in process: the real model and
a SQLite store, 64 agents (`--agents`) holding four facts each, exchanges round-robin over
the agents, their user messages' vectors already in the query cache (as the recall before the model
call leaves them). Each pass stores `--batch` exchanges, as the worker does with what has
queued up; two kinds of exchange:

- same: every exchange repeats the agent's previous one (the benchmarks' `/v1` load), so
  the store only finds the fragment and compares it;
- new: every exchange a new text (questions of scripts/data/recall_set.json), a new row.

    python scripts/bench_memory_worker.py [--exchanges 1600] [--batch 1,16] [--agents 64]

Prints figures only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # (after PYTHONPATH: another checkout can be measured)

from agentd.config import MemoryConfig  # noqa: E402
from agentd.memory.service import MemoryService  # noqa: E402
from agentd.store import open_store  # noqa: E402

FACTS = ["The user's favourite colour is teal.", "The user works night shifts at a hospital.",
         "The user is learning Portuguese for a trip to Porto.", "The user's cat is called Miso."]
ANSWER = "Hi! How can I help you today?"


def per_exchange(kind: str, batch: int, exchanges: int, agent_count: int = 64) -> float:
    """CPU ms per exchange stored `batch` at a time."""
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "agentd.db")
        svc = MemoryService(MemoryConfig(auto_remember=True), store)
        try:
            agents = [str(uuid.uuid4()) for _ in range(agent_count)]
            for agent in agents:
                for fact in FACTS:
                    svc.remember(agent, fact)
            if kind == "same":
                texts = ["hello"]
            else:
                data = json.loads((ROOT / "scripts" / "data" / "recall_set.json").read_text())
                texts = [q["query"] for q in data["queries"]] + [f["content"] for f in data["fragments"]]
            semantic = svc.semantic
            embedder = semantic.embedder
            semantic.queries.size = len(texts)
            for start in range(0, len(texts), 64):
                chunk = texts[start:start + 64]
                for text, vector in zip(chunk, embedder.embed(chunk)):
                    semantic.queries.put(embedder.name, text, vector)

            def item(n: int) -> tuple:
                agent, text = agents[n % len(agents)], texts[n % len(texts)]
                return agent, text, f"User asked: {text}\nI responded: {ANSWER}", {"session_id": f"s-{agent}",
                                                                                     "owner": ""}

            warm = 200
            for n in range(0, warm, batch):
                svc._store_exchanges([item(k) for k in range(n, n + batch)])
            started = time.process_time()
            for n in range(warm, warm + exchanges, batch):
                svc._store_exchanges([item(k) for k in range(n, n + batch)])
            return (time.process_time() - started) * 1000 / exchanges
        finally:
            svc.close()
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=1600)
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--agents", type=int, default=64, help="agents holding four facts each (their indexes loaded)")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    print(f"{'exchange':<8} " + " ".join(f"| {'ms, ' + str(b) + ' per pass':>16}" for b in batches))
    for kind in ("same", "new"):
        figures = [per_exchange(kind, b, args.exchanges, args.agents) for b in batches]
        print(f"{kind:<8} " + " ".join(f"| {figure:>16.3f}" for figure in figures), flush=True)


if __name__ == "__main__":
    main()
