#!/usr/bin/env python3
"""CPU per exchange of the auto-remember worker's store, in process: the real model and
a SQLite store, 64 agents (`--agents`) holding four facts each, exchanges round-robin over
the agents, their user messages' vectors already in the query cache (as the recall before the model
call leaves them). Each pass stores `--batch` exchanges, as the worker does with what has
queued up; two kinds of exchange:

- same: every exchange repeats the agent's previous one (the benchmarks' `/v1` load), so
  the store only finds the fragment and compares it;
- new: every exchange a new text (questions of scripts/data/recall_set.json), a new row.

    python scripts/bench_memory_worker.py [--exchanges 1600] [--batch 1,16] [--agents 64] [--opcodes]

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
sys.path.append(str(ROOT / "tests"))

from agentd.config import MemoryConfig  # noqa: E402
from agentd.memory.service import MemoryService  # noqa: E402
from agentd.store import open_store  # noqa: E402
from memsupport import add_agents  # noqa: E402

FACTS = ["The user's favourite colour is teal.", "The user works night shifts at a hospital.",
         "The user is learning Portuguese for a trip to Porto.", "The user's cat is called Miso."]
ANSWER = "Hi! How can I help you today?"


def _instructions(store_batch, batches: list) -> float:
    """Python bytecode instructions run by `store_batch` over `batches`, per exchange (C
    parts, SQLite and numpy, count as the one instruction that called them)."""
    count = [0]

    def trace(frame, event, arg):  # noqa: ANN001 - sys.settrace's signature
        frame.f_trace_opcodes, frame.f_trace_lines = True, False

        def local(frame, event, arg):  # noqa: ANN001
            if event == "opcode":
                count[0] += 1
            return local
        return local

    sys.settrace(trace)
    try:
        for items in batches:
            store_batch(items)
    finally:
        sys.settrace(None)
    return count[0] / sum(len(items) for items in batches)


def per_exchange(kind: str, batch: int, exchanges: int, agent_count: int = 64,
                 opcodes: bool = False) -> float:
    """CPU ms per exchange stored `batch` at a time (with `opcodes`: Python instructions)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "agentd.db")
        svc = MemoryService(MemoryConfig(auto_remember=True), store)
        try:
            agents = [str(uuid.uuid4()) for _ in range(agent_count)]
            add_agents(store, agents)  # fragments are stored only for an existing agent
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
            if opcodes:
                return _instructions(svc._store_exchanges, [[item(k) for k in range(n, n + batch)]
                                                            for n in range(warm, warm + 320, batch)])
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
    parser.add_argument("--opcodes", action="store_true",
                        help="Python bytecode instructions per exchange instead of CPU (a busy host does not move it)")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    unit = "instructions" if args.opcodes else "ms"
    print(f"{'exchange':<8} " + " ".join(f"| {unit + ', ' + str(b) + ' per pass':>22}" for b in batches))
    for kind in ("same", "new"):
        figures = [per_exchange(kind, b, args.exchanges, args.agents, args.opcodes) for b in batches]
        print(f"{kind:<8} " + " ".join(f"| {figure:>22.{0 if args.opcodes else 3}f}" for figure in figures), flush=True)


if __name__ == "__main__":
    main()
