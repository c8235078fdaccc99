#!/usr/bin/env python3
"""Agent benchmark: what agentd adds on top of the model call.

Against the fake LLM answering instantly (in its own process), prints:
- messages/s through POST /api/agents/{id}/message with 1 agent and with 32 agents in
  parallel, next to the fake LLM called directly at the same concurrency, as a ratio
  and as added milliseconds per message (p50);
- the added overhead of a 3-iteration tool run;
- spawn rate and GET /api/agents latency with 1,000 agents;
Figures only; nothing is asserted.

    python scripts/bench_agents.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import requests

from benchlib import bench_daemon, fake_llm, summary, timed_loop

SESSION_TURNS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--agents", type=int, default=1000)
    args = parser.parse_args()
    with fake_llm() as fake_url, bench_daemon(fake_url) as daemon:
        sessions = [requests.Session() for _ in range(32)]
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}

        def direct(i: int) -> None:
            sessions[i].post(f"{fake_url}/v1/chat/completions", json=body).raise_for_status()

        ids = []
        for i in range(32):
            r = daemon.post("/api/agents", json={"manifest_toml": f'name = "bench{i}"\nprofile = "minimal"\n'})
            ids.append(r.json()["agent_id"])

        def via_agent(i: int) -> None:
            r = sessions[i].post(f"{daemon.url}/api/agents/{ids[i]}/message", json={"message": "hi"})
            r.raise_for_status()

        def fresh_session(i: int, calls: int) -> None:
            # A conversation of SESSION_TURNS messages, then a new one: sessions stay realistic
            # instead of growing for the whole run (every message resends the full history).
            if calls % SESSION_TURNS == 0:
                sessions[i].post(f"{daemon.url}/api/agents/{ids[i]}/session/reset").raise_for_status()

        print("messages/s through POST /api/agents/{id}/message vs the fake LLM called directly")
        print(f"(each agent's session is reset every {SESSION_TURNS} messages, untimed)")
        print(f"{'clients':>7} | {'direct/s':>9} {'p50 ms':>7} | {'agentd/s':>9} {'p50 ms':>7} | ratio | added p50 ms")
        for clients in (1, 32):
            d_rate, d_p50 = summary(timed_loop(direct, clients, args.seconds), args.seconds)
            a_rate, a_p50 = summary(timed_loop(via_agent, clients, args.seconds, fresh_session), args.seconds)
            print(f"{clients:>7} | {d_rate:>9.0f} {d_p50:>7.2f} | {a_rate:>9.0f} {a_p50:>7.2f} | "
                  f"{a_rate / d_rate:.2f} | {a_p50 - d_p50:.2f}")

        tool_msg = {"message": '[[tool:file_list {"path": "."} x2]]'}

        def tool_run(i: int) -> None:
            r = sessions[0].post(f"{daemon.url}/api/agents/{ids[0]}/message", json=tool_msg)
            assert r.json()["iterations"] == 3, r.text

        lat = timed_loop(tool_run, 1, args.seconds, fresh_session)
        d_rate, d_p50 = summary(timed_loop(direct, 1, args.seconds), args.seconds)
        t_p50 = statistics.median(lat) * 1000
        print(f"3-iteration tool run: p50 {t_p50:.2f} ms = 3 model calls ({3 * d_p50:.2f} ms direct) "
              f"+ {t_p50 - 3 * d_p50:.2f} ms added ({(t_p50 - 3 * d_p50) / 3:.2f} ms per iteration)")

        began = time.perf_counter()
        for i in range(args.agents - 32):
            r = sessions[0].post(f"{daemon.url}/api/agents",
                                 json={"manifest_toml": f'name = "spawn{i}"\nprofile = "minimal"\n'})
            r.raise_for_status()
        spawn_time = time.perf_counter() - began
        print(f"spawn rate: {(args.agents - 32) / spawn_time:.0f} agents/s")
        lat = []
        for _ in range(20):
            start = time.perf_counter()
            agents = sessions[0].get(f"{daemon.url}/api/agents").json()
            lat.append(time.perf_counter() - start)
        print(f"GET /api/agents with {len(agents)} agents: p50 {statistics.median(lat) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
