#!/usr/bin/env python3
"""agentd next to the bare stack it runs on, under the same load, in one run.

Starts a fast canned OpenAI upstream (scripts/fast_upstream.py), the bare
Flask + waitress + requests pass-through proxy (scripts/bare_proxy.py: the ceiling
of our stack) and agentd with N agents on that upstream; drives each with the same
load (wrk when installed, pinned to core 0 with the upstream, the server alone on
core 1; else a Python load generator) at 1 and 32 connections, streaming and not;
prints p50/p99/rps and the ratios to the bare proxy. `--peer URL` adds any
OpenAI-compatible proxy to the table (its `model` from `--peer-model`).

Then: cold start (launch to first 200 from /api/health), idle RSS, memory per idle
agent, GET /api/agents with 1,000 agents, 32 agents messaged at once and a 16-way
fan-out workflow against a 500 ms upstream, and RSS over 2 x 10,000 messages across 64
agents. Figures only; nothing is asserted.

The throughput table has agentd twice: with `[memory] auto_remember = false` (the request
path itself) and, in the "default" rows, as installed (auto-remember and recall on, each
agent holding a few remembered facts, so every message recalls and every exchange is
embedded). `--auto-remember` runs every other part with the default memory settings too.

    python scripts/bench_side_by_side.py [--seconds 5] [--agents 64] [--peer URL]
    python scripts/bench_side_by_side.py --only throughput|cold|scale|parallel|rss
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import send_messages, rss_mb, wait_quiet  # noqa: E402
from support import FAST_API, Daemon, free_port, make_home  # noqa: E402

WRK_SCRIPT = """
local targets = %s
local n = #targets
local counter = 0
request = function()
  counter = counter + 1
  local t = targets[(counter %% n) + 1]
  return wrk.format("POST", t[1], {["Content-Type"] = "application/json"}, t[2])
end
done = function(summary, latency, requests)
  io.write(string.format("WRKJSON {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"p50_us\\": %%d, \\"p99_us\\": %%d, \\"non2xx\\": %%d, \\"errors\\": %%d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def start_process(args: list[str], cpu: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start a helper process that prints its URL first; returns (process, url)."""
    cmd = (["taskset", "-c", cpu] if cpu and shutil.which("taskset") else []) + args
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def pin(pid: int, cpu: str) -> None:
    if shutil.which("taskset"):
        subprocess.run(["taskset", "-a", "-pc", cpu, str(pid)], capture_output=True, check=False)


def wait_up(url: str, method: str = "GET", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            requests.request(method, url, timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.02)
    raise RuntimeError(f"{url} never came up")


def targets_for(kind: str, names: list[str], ids: list[str], stream: bool) -> list[tuple[str, str]]:
    """(path, body) pairs addressing every agent in turn."""
    if kind == "message":
        return [(f"/api/agents/{i}/message", json.dumps({"message": "hello"})) for i in ids]
    if kind == "stream_message":
        return [(f"/api/agents/{i}/message/stream", json.dumps({"message": "hello"})) for i in ids]
    body = {"messages": [{"role": "user", "content": "hello"}], "stream": stream}
    return [("/v1/chat/completions", json.dumps({**body, "model": f"agentd:{n}"})) for n in names]


def run_wrk(base: str, targets: list[tuple[str, str]], conns: int, seconds: float) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        lua_targets = "{" + ",".join("{%s,%s}" % (json.dumps(p), json.dumps(b)) for p, b in targets) + "}"
        fh.write(WRK_SCRIPT % lua_targets)
        script = fh.name
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "-s", script, base]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "0"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    os.unlink(script)
    line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    data = json.loads(line[8:])
    return {"rps": data["requests"] / (data["duration_us"] / 1e6), "p50": data["p50_us"] / 1000,
            "p99": data["p99_us"] / 1000, "bad": data["non2xx"] + data["errors"]}


def run_python(base: str, targets: list[tuple[str, str]], conns: int, seconds: float) -> dict:
    latencies: list[float] = []
    bad = [0]
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker(offset: int) -> None:
        # On core 0, as wrk is: the servers have core 1 to themselves (a thread's own affinity).
        if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:
            os.sched_setaffinity(0, {0})
        s = requests.Session()
        own: list[float] = []
        k = offset
        while time.perf_counter() < stop_at:
            path, body = targets[k % len(targets)]
            k += conns
            began = time.perf_counter()
            r = s.post(base + path, data=body, headers={"Content-Type": "application/json"})
            own.append(time.perf_counter() - began)
            if r.status_code != 200:
                bad[0] += 1
        with lock:
            latencies.extend(own)

    began = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies)
    return {"rps": len(ordered) / elapsed, "p50": ordered[len(ordered) // 2] * 1000,
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, "bad": bad[0]}


MEMORY_OFF = "\n[memory]\nauto_remember = false\n"
AUTO_REMEMBER = [False]  # --auto-remember


def agentd_daemon(tmp: Path, upstream: str, extra: str = "", env: dict[str, str] | None = None) -> Daemon:
    """agentd on a temp home, every model call to `upstream` (`env` adds variables, such as
    AGENTD_DATABASE_URL)."""
    if not AUTO_REMEMBER[0] and "[memory]" not in extra:
        extra += MEMORY_OFF
    config = (FAST_API + extra + '\n[default_model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
              f'api_key_env = "OPENAI_API_KEY"\n[provider_urls]\nopenai = "{upstream}"\n')
    return Daemon(make_home(tmp, config), env_extra={"OPENAI_API_KEY": "bench", **(env or {})}).start()


def spawn_agents(d: Daemon, count: int, prefix: str = "bench") -> tuple[list[str], list[str]]:
    names, ids = [], []
    for i in range(count):
        name = f"{prefix}-{i}"
        r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\nprofile = "minimal"\n'})
        r.raise_for_status()
        names.append(name)
        ids.append(r.json()["agent_id"])
    return names, ids


def reset_sessions(d: Daemon, ids: list[str]) -> None:
    for agent_id in ids:
        d.post(f"/api/agents/{agent_id}/session/reset")


def throughput_table(args: argparse.Namespace, upstream: str) -> None:
    load = run_wrk if shutil.which("wrk") and not args.python_load else run_python
    print(f"load generator: {'wrk (core 0)' if load is run_wrk else 'python threads (core 0)'}; "
          f"{args.seconds:g} s per cell, medians of {args.rounds} rounds, {args.agents} agents round-robin, "
          f"{args.warmup:g} s unrecorded warm-up per setup")
    bare_port = free_port()
    bare = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bare_proxy.py"), str(bare_port), upstream])
    bare_url = f"http://127.0.0.1:{bare_port}"
    try:
        wait_up(bare_url + "/v1/chat/completions", "GET")
        pin(bare.pid, "1")
        _throughput(args, upstream, bare_url, load)
    finally:
        bare.terminate()
        bare.wait(10)


FACTS = ["The user's favourite colour is teal.", "The user works night shifts at a hospital.",
         "The user is learning Portuguese for a trip to Porto.", "The user's cat is called Miso."]


def _throughput(args: argparse.Namespace, upstream: str, bare_url: str, load) -> None:
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as tmp2:
        d = agentd_daemon(Path(tmp), upstream)
        full = agentd_daemon(Path(tmp2), upstream, extra="\n[memory]\nauto_remember = true\n")
        try:
            rows, idle = _cells(args, d, full, bare_url, load)
        finally:
            d.stop()
            full.stop()
    _print_table(rows, idle)


def seed_memory(d: Daemon, ids: list[str]) -> None:
    """A few facts per agent, so each message is recalled against (the model loads here)."""
    for agent_id in ids:
        for fact in FACTS:
            d.post(f"/api/memory/agents/{agent_id}/memories", json={"content": fact}).raise_for_status()


def _cells(args: argparse.Namespace, d: Daemon, full: Daemon, bare_url: str, load) -> tuple[list, float]:
    pin(d.proc.pid, "1")
    pin(full.proc.pid, "1")
    names, ids = spawn_agents(d, args.agents)
    full_names, full_ids = spawn_agents(full, args.agents)
    seed_memory(full, full_ids)
    agents = {d.url: (names, ids), full.url: (full_names, full_ids)}
    setups = [("bare proxy", bare_url, "v1", False), ("agentd /v1", d.url, "v1", False),
              ("agentd /v1 default", full.url, "v1", False),
              ("agentd message", d.url, "message", False),
              ("agentd message default", full.url, "message", False),
              ("bare proxy stream", bare_url, "v1", True), ("agentd /v1 stream", d.url, "v1", True),
              ("agentd SSE message", d.url, "stream_message", True)]
    if args.peer:
        setups.insert(1, ("peer " + args.peer, args.peer, "peer", False))
    if args.warmup > 0:
        # Not recorded: the first requests of a fresh process load what serving loads on
        # first use (agentd's drivers, each thread's database connection). Cold start is
        # its own figure.
        for label, base, kind, stream in setups:
            if kind != "peer":
                load(base, targets_for(kind, *agents.get(base, (names, ids)), stream), 1, args.warmup)
    samples: dict[tuple[str, int], list[dict]] = {(setup[0], conns): [] for setup in setups for conns in (1, 32)}
    # Each round runs every setup in turn: a host that slows down for a while (another
    # tenant, a frequency change) slows the bare proxy's round and agentd's alike, so the
    # ratios the bars are about move less from run to run than when each setup ran all
    # its rounds at once.
    for conns in (1, 32):
        for _ in range(args.rounds):
            for label, base, kind, stream in setups:
                if base in agents:
                    server = d if base == d.url else full
                    reset_sessions(server, agents[base][1])
                    # Exchanges of the previous cell are embedded before this one starts.
                    wait_quiet(server.proc.pid)
                if kind == "peer":
                    body = json.dumps({"model": args.peer_model, "messages": [{"role": "user", "content": "hello"}]})
                    targets = [("/v1/chat/completions", body)]
                    base_url = args.peer.rstrip("/").removesuffix("/v1")
                else:
                    targets = targets_for(kind, *agents.get(base, (names, ids)), stream)
                    base_url = base
                samples[(label, conns)].append(load(base_url, targets, conns, args.seconds))
    rows = [(label, {conns: {k: statistics.median(s[k] for s in samples[(label, conns)])
                             for k in samples[(label, conns)][0]} for conns in (1, 32)})
            for label, _, _, _ in setups]
    return rows, rss_mb(d.proc.pid)


def _print_table(rows: list, idle: float) -> None:
    ref = {"plain": rows[0][1], "stream": next(c for label, c in rows if label == "bare proxy stream")}
    print(f"\n{'setup':<22} | {'p50@1':>7} {'p99@1':>7} {'rps@1':>7} | {'p50@32':>7} {'p99@32':>7} "
          f"{'rps@32':>7} | {'p50-bare@1':>10} {'rps/bare@1':>10} {'rps/bare@32':>11} | errors")
    for label, cells in rows:
        r = ref["stream"] if "stream" in label or "SSE" in label else ref["plain"]
        print(f"{label:<22} | {cells[1]['p50']:>7.2f} {cells[1]['p99']:>7.2f} {cells[1]['rps']:>7.0f} | "
              f"{cells[32]['p50']:>7.2f} {cells[32]['p99']:>7.2f} {cells[32]['rps']:>7.0f} | "
              f"{cells[1]['p50'] - r[1]['p50']:>+10.2f} {cells[1]['rps'] / r[1]['rps']:>10.2f} "
              f"{cells[32]['rps'] / r[32]['rps']:>11.2f} | {int(cells[1]['bad'] + cells[32]['bad'])}")
    print(f"agentd RSS after the load: {idle:.1f} MB")


def cold_start(starts: int) -> None:
    """Launch to the first 200 from /api/health (the issue's figure) and to the first 200
    from /api/status (everything loaded: the kernel answers); idle RSS once ready; the
    daemon's CPU (user + system) from launch to exit, one idle second included: what a
    start and a stop cost on a busy host, where the times above grow with the load."""
    times, ready, rss, cpu = [], [], [], []
    for _ in range(starts):
        with tempfile.TemporaryDirectory() as tmp:
            d = Daemon(make_home(Path(tmp)))
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.perf_counter()
            d.start(wait=False)
            for path, into in (("/api/health", times), ("/api/status", ready)):
                while True:
                    try:
                        if requests.get(f"{d.url}{path}", timeout=30).status_code == 200:
                            break
                    except requests.RequestException:
                        time.sleep(0.002)
                into.append(time.perf_counter() - began)
            time.sleep(1.0)
            rss.append(rss_mb(d.proc.pid))
            d.stop()
            done = resource.getrusage(resource.RUSAGE_CHILDREN)  # the daemon, waited for by stop()
            cpu.append(done.ru_utime - children.ru_utime + done.ru_stime - children.ru_stime)
    print(f"\ncold start (launch to first 200 from /api/health): median {statistics.median(times) * 1000:.0f} ms "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, n={starts}); to the first 200 from "
          f"/api/status (kernel loaded): median {statistics.median(ready) * 1000:.0f} ms; "
          f"idle RSS {statistics.median(rss):.1f} MB; daemon CPU from launch to exit: median "
          f"{statistics.median(cpu) * 1000:.0f} ms")


def agents_at_scale(upstream: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = agentd_daemon(Path(tmp), upstream)
        before = rss_mb(d.proc.pid)
        spawn_agents(d, 1000, "idle")
        time.sleep(0.5)
        after = rss_mb(d.proc.pid)
        lat = []
        for _ in range(50):
            began = time.perf_counter()
            d.get("/api/agents").raise_for_status()
            lat.append(time.perf_counter() - began)
        page = []
        if d.get("/agents").status_code == 200:
            for _ in range(20):
                began = time.perf_counter()
                d.get("/agents")
                page.append(time.perf_counter() - began)
        d.stop()
    print(f"\n1,000 agents: memory per idle agent {(after - before) * 1024 / 1000:.1f} KB; "
          f"GET /api/agents p50 {statistics.median(lat) * 1000:.1f} ms"
          + (f"; dashboard /agents p50 {statistics.median(page) * 1000:.1f} ms" if page else ""))


def slow_upstream_parallelism(delay_ms: float) -> None:
    proc, upstream = start_process([sys.executable, str(ROOT / "scripts" / "fast_upstream.py"),
                                    "--delay-ms", str(delay_ms)])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = agentd_daemon(Path(tmp), upstream)
            names, ids = spawn_agents(d, 32, "par")
            began = time.perf_counter()
            d.post(f"/api/agents/{ids[0]}/message", json={"message": "one"}).raise_for_status()
            one = time.perf_counter() - began
            results: list[int] = []

            def send(agent_id: str) -> None:
                results.append(requests.post(f"{d.url}/api/agents/{agent_id}/message",
                                             json={"message": "many"}, timeout=60).status_code)

            threads = [threading.Thread(target=send, args=(i,)) for i in ids]
            began = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            many = time.perf_counter() - began
            print(f"\n{delay_ms:.0f} ms upstream: one message {one * 1000:.0f} ms; 32 agents at once "
                  f"{many * 1000:.0f} ms ({many / one:.2f}x one; {results.count(200)}/32 answered 200)")
            steps = [{"name": "first", "agent_name": names[0], "prompt": "{{input}}"}]
            single = d.post("/api/workflows", json={"name": "one-step", "steps": steps}).json()["workflow_id"]
            fan = [{"name": f"b{i}", "agent_name": names[i], "mode": "fan_out", "prompt": "{{input}}"}
                   for i in range(16)] + [{"name": "join", "mode": "collect"}]
            fanned = d.post("/api/workflows", json={"name": "fan16", "steps": fan}).json()["workflow_id"]
            timings = {}
            for label, wf in (("one step", single), ("16-way fan-out", fanned)):
                began = time.perf_counter()
                r = d.post(f"/api/workflows/{wf}/run", json={"input": "go"}, timeout=120)
                timings[label] = time.perf_counter() - began
                if r.json().get("status") != "completed":
                    print(f"  {label} did not complete: {r.text[:200]}")
            print(f"workflow: one step {timings['one step'] * 1000:.0f} ms; 16-way fan-out "
                  f"{timings['16-way fan-out'] * 1000:.0f} ms ({timings['16-way fan-out'] / timings['one step']:.2f}x)")
            d.stop()
    finally:
        proc.terminate()
        proc.wait(10)


def rss_stability(upstream: str, count: int, agents: int = 64, conns: int = 16) -> None:
    """RSS after `count` messages across `agents` agents, and after `count` more."""
    with tempfile.TemporaryDirectory() as tmp:
        d = agentd_daemon(Path(tmp), upstream)
        _, ids = spawn_agents(d, agents, "rss")
        figures = [rss_mb(d.proc.pid)]
        for _ in range(2):
            began = time.perf_counter()
            bad = send_messages(d.url, ids, count, conns)
            figures.append(rss_mb(d.proc.pid))
            rate = count / (time.perf_counter() - began)
            print(f"  {count} messages ({rate:.0f}/s, {bad} not 200): RSS {figures[-1]:.1f} MB")
        d.stop()
    print(f"\nRSS over 2 x {count} messages across {agents} agents: {figures[0]:.1f} MB idle -> "
          f"{figures[1]:.1f} MB -> {figures[2]:.1f} MB (second batch {figures[2] - figures[1]:+.1f} MB, "
          f"{(figures[2] / figures[1] - 1) * 100:+.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=1.0,
                        help="seconds of unrecorded load on each setup before its cells (0: none)")
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--peer", default="", help="base URL of another OpenAI-compatible proxy (…/v1)")
    parser.add_argument("--peer-model", default="gpt-4o")
    parser.add_argument("--python-load", action="store_true", help="use the Python load generator even if wrk exists")
    parser.add_argument("--only", choices=["throughput", "cold", "scale", "parallel", "rss"], default=None)
    parser.add_argument("--rss-messages", type=int, default=10_000, help="messages per RSS batch")
    parser.add_argument("--auto-remember", action="store_true",
                        help="keep [memory] auto_remember on (embeds every exchange in the background)")
    args = parser.parse_args()
    AUTO_REMEMBER[0] = args.auto_remember
    print(f"agentd config: [memory] auto_remember = {'true' if args.auto_remember else 'false'}")
    upstream_proc, upstream = start_process([sys.executable, str(ROOT / "scripts" / "fast_upstream.py")], cpu="0")
    try:
        if args.only in (None, "throughput"):
            throughput_table(args, upstream)
        if args.only in (None, "cold"):
            cold_start(args.starts)
        if args.only in (None, "scale"):
            agents_at_scale(upstream)
        if args.only in (None, "rss"):
            rss_stability(upstream, args.rss_messages)
    finally:
        upstream_proc.terminate()
        upstream_proc.wait(10)
    if args.only in (None, "parallel"):
        slow_upstream_parallelism(500)


if __name__ == "__main__":
    main()
