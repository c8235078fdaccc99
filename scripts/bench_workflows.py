#!/usr/bin/env python3
"""Workflow benchmark: what the engine adds on top of the agent runs it makes.

Against the fake LLM answering instantly (in its own process), prints:
- a 10-step sequential run's wall time minus 10 direct fake-LLM calls, as added ms per
  step (goal: under 10 ms), next to a plain agent message for reference;
- a 16-way fan-out's wall time next to a 1-step workflow's (goal: close to 1x, bounded
  by the executor's 32 threads);
- runs/s of a 3-step workflow with 8 clients running it concurrently.
Each step's agent keeps its session; sessions are reset between runs, untimed, so the
history sent to the model stays short (as in bench_agents). Figures only; nothing is asserted.

    python scripts/bench_workflows.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import requests

from benchlib import bench_daemon, fake_llm, summary, timed_loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=40, help="timed runs per single-run figure")
    args = parser.parse_args()
    with fake_llm() as fake_url, bench_daemon(fake_url) as daemon:
        http = requests.Session()
        ids = {}
        for i in range(16):
            r = daemon.post("/api/agents", json={"manifest_toml": f'name = "wf{i}"\nprofile = "minimal"\n'})
            ids[f"wf{i}"] = r.json()["agent_id"]

        def workflow(steps: list[dict]) -> str:
            r = http.post(f"{daemon.url}/api/workflows", json={"name": "bench", "steps": steps})
            r.raise_for_status()
            return r.json()["workflow_id"]

        def reset(names: list[str]) -> None:
            for name in names:
                http.post(f"{daemon.url}/api/agents/{ids[name]}/session/reset").raise_for_status()

        def time_run(workflow_id: str, agents: list[str]) -> float:
            """Median wall time (s) of one run, sessions reset before each (untimed)."""
            times = []
            for _ in range(args.repeats):
                reset(agents)
                start = time.perf_counter()
                r = http.post(f"{daemon.url}/api/workflows/{workflow_id}/run", json={"input": "hi"})
                times.append(time.perf_counter() - start)
                assert r.json()["status"] == "completed", r.text
            return statistics.median(times)

        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        direct = []
        for _ in range(200):
            start = time.perf_counter()
            http.post(f"{fake_url}/v1/chat/completions", json=body).raise_for_status()
            direct.append(time.perf_counter() - start)
        direct_ms = statistics.median(direct) * 1000
        message = []
        for i in range(args.repeats):
            if i % 10 == 0:
                reset(["wf0"])
            start = time.perf_counter()
            http.post(f"{daemon.url}/api/agents/{ids['wf0']}/message", json={"message": "hi"}).raise_for_status()
            message.append(time.perf_counter() - start)
        message_ms = statistics.median(message) * 1000

        # Ten steps alternating between two agents, each step feeding the next.
        seq_agents = ["wf0", "wf1"]
        seq = workflow([{"name": f"s{i}", "agent_name": seq_agents[i % 2], "prompt": "[[reply:ok]] {{input}}"}
                        for i in range(10)])
        seq_ms = time_run(seq, seq_agents) * 1000
        print(f"fake LLM direct call p50 {direct_ms:.2f} ms; one agent message via HTTP p50 {message_ms:.2f} ms "
              f"({message_ms - direct_ms:.2f} ms added)")
        print(f"10-step sequential run: p50 {seq_ms:.1f} ms = 10 direct calls ({10 * direct_ms:.1f} ms) "
              f"+ {seq_ms - 10 * direct_ms:.1f} ms -> {(seq_ms - 10 * direct_ms) / 10:.2f} ms added per step "
              "(goal < 10)")

        one = workflow([{"name": "only", "agent_name": "wf0", "prompt": "[[reply:ok]]"}])
        one_ms = time_run(one, ["wf0"]) * 1000
        fan_agents = [f"wf{i}" for i in range(16)]
        fan = workflow([{"name": f"f{i}", "agent_name": name, "mode": "fan_out", "prompt": "[[reply:ok]]"}
                        for i, name in enumerate(fan_agents)] + [{"name": "join", "mode": "collect"}])
        fan_ms = time_run(fan, fan_agents) * 1000
        print(f"16-way fan-out + collect: p50 {fan_ms:.1f} ms vs 1-step workflow {one_ms:.1f} ms "
              f"-> {fan_ms / one_ms:.2f}x (16 sequential calls would be ~{16 * one_ms:.0f} ms)")
        slow = workflow([{"name": f"f{i}", "agent_name": name, "mode": "fan_out", "prompt": "[[slow:0.2]]"}
                         for i, name in enumerate(fan_agents)] + [{"name": "join", "mode": "collect"}])
        slow_one = workflow([{"name": "only", "agent_name": "wf0", "prompt": "[[slow:0.2]]"}])
        reset(fan_agents)
        start = time.perf_counter()
        http.post(f"{daemon.url}/api/workflows/{slow}/run", json={"input": ""}).raise_for_status()
        slow_fan_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        http.post(f"{daemon.url}/api/workflows/{slow_one}/run", json={"input": ""}).raise_for_status()
        slow_one_ms = (time.perf_counter() - start) * 1000
        print(f"  with a 200 ms model: 16-way fan-out {slow_fan_ms:.0f} ms vs one step {slow_one_ms:.0f} ms "
              f"-> {slow_fan_ms / slow_one_ms:.2f}x")

        # Three steps; each of the 8 clients has its own agents so runs do not queue on one agent.
        three = []
        for c in range(8):
            names = []
            for k in range(3):
                name = f"c{c}s{k}"
                r = daemon.post("/api/agents", json={"manifest_toml": f'name = "{name}"\nprofile = "minimal"\n'})
                ids[name] = r.json()["agent_id"]
                names.append(name)
            three.append((workflow([{"name": f"s{k}", "agent_name": n, "prompt": "[[reply:ok]] {{input}}"}
                                    for k, n in enumerate(names)]), names))
        sessions = [requests.Session() for _ in range(8)]

        def run_three(i: int) -> None:
            r = sessions[i].post(f"{daemon.url}/api/workflows/{three[i][0]}/run", json={"input": "hi"})
            assert r.json()["status"] == "completed", r.text

        def between(i: int, calls: int) -> None:
            if calls % 5 == 0:
                for name in three[i][1]:
                    sessions[i].post(f"{daemon.url}/api/agents/{ids[name]}/session/reset").raise_for_status()

        for clients in (1, 8):
            rate, p50 = summary(timed_loop(run_three, clients, args.seconds, between), args.seconds)
            print(f"3-step workflow, {clients} concurrent client(s): {rate:.0f} runs/s, p50 {p50:.1f} ms "
                  f"({3 * rate:.0f} steps/s)")
        runs = http.get(f"{daemon.url}/api/workflows/{three[0][0]}/runs").json()
        print(f"run records kept for one workflow after the load: {len(runs)} (retention 200 across all)")


if __name__ == "__main__":
    main()
