#!/usr/bin/env python3
"""Dashboard benchmark: server time and first-load weight of every page with 1,000 agents.

Starts the real daemon (fake LLM behind it), spawns 1,000 agents, gives one of them a
40-message session, a workflow with a run and some usage, then GETs every page
`--requests` times. Prints per page: server time from the `Server-Timing` header
(p50/p99), client latency, HTML bytes and HTML+CSS+JS bytes; and, as the reference
measured in the same run, GET /api/agents (the same 1,000 agents as JSON).
Figures only; nothing is asserted.

    python scripts/bench_dashboard.py [--agents 1000] [--requests 30]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from benchlib import bench_daemon, fake_llm, percentile


def timings(session: requests.Session, url: str, count: int) -> tuple[list[float], list[float], int]:
    server, client, size = [], [], 0
    for _ in range(2):  # warm-up: first reads of sessions and templates are not the steady state
        session.get(url)
    for _ in range(count):
        began = time.perf_counter()
        r = session.get(url)
        client.append((time.perf_counter() - began) * 1000)
        r.raise_for_status()
        size = len(r.content)
        match = re.search(r"dur=([0-9.]+)", r.headers.get("Server-Timing", ""))
        if match:
            server.append(float(match.group(1)))
    return server, client, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    with fake_llm() as fake, bench_daemon(fake) as d:
        began = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda i: d.post("/api/agents", json={
                "manifest_toml": f'name = "agent-{i:04d}"\ndescription = "bench agent {i}"\n'}).json()["agent_id"],
                range(args.agents)))
        print(f"spawned {len(ids)} agents in {time.perf_counter() - began:.1f}s")
        busy = ids[0]
        for i in range(20):
            d.post(f"/api/agents/{busy}/message", json={"message": f"message {i} [[chunks:30]]"}).raise_for_status()
        d.put(f"/api/memory/agents/{busy}/kv/notes", json={"k": "v" * 200})
        wf = d.post("/api/workflows", json={"name": "bench", "steps": [
            {"name": "one", "agent_name": "agent-0001", "prompt": "{{input}}"}]}).json()["workflow_id"]
        d.post(f"/api/workflows/{wf}/run", json={"input": "go"}).raise_for_status()
        session = requests.Session()
        css = len(session.get(f"{d.url}/static/app.css").content)
        js = len(session.get(f"{d.url}/static/app.js").content)
        pages = ["/", "/agents", f"/agents/{busy}", f"/agents/{busy}/memory", "/approvals", "/usage",
                 "/models", "/providers", "/workflows", f"/workflows/{wf}", "/channels"]
        print(f"static: app.css {css} B, app.js {js} B (budget: JS <= 10240 B)")
        print(f"{'page':<52} {'server p50':>10} {'p99':>7} {'client p50':>10} {'HTML B':>8} {'+CSS+JS':>8}")
        ref_server, ref_client, ref_size = timings(session, f"{d.url}/api/agents", args.requests)
        for path in pages:
            server, client, size = timings(session, f"{d.url}{path}", args.requests)
            print(f"{path:<52} {statistics.median(server):>8.1f}ms {percentile(server, 99):>5.1f}ms "
                  f"{statistics.median(client):>8.1f}ms {size:>8} {size + css + js:>8}")
        print(f"{'reference: GET /api/agents (JSON, client time)':<52} {'':>10} {'':>7} "
              f"{statistics.median(ref_client):>8.1f}ms {ref_size:>8}")
        agents_page = statistics.median(timings(session, f"{d.url}/agents", args.requests)[1])
        print(f"/agents page vs /api/agents JSON (client p50): {agents_page / statistics.median(ref_client):.2f}x")


if __name__ == "__main__":
    main()
