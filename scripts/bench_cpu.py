#!/usr/bin/env python3
"""Server CPU time per request: agentd next to the bare proxy, robust on a loaded machine.

Wall-clock figures swing with whatever else the machine runs; the CPU seconds a server
process spends per request do not (much). This starts the fast upstream, the bare
Flask + waitress + requests proxy and agentd with N agents, drives each with the same
load (wrk, or Python threads) and prints, per setup and connection count, the server's
CPU milliseconds per request (utime + stime of all its threads from /proc, divided by the
requests answered), the difference to the bare proxy and the ratio. The "default" row is
`/v1` on a second daemon as installed (auto-remember and recall on, four facts per agent),
its memory worker's catch-up after each cell included; the "whole" row the same with
`[memory] embed_whole_exchange = true`. `--profile FILE`
records agentd under the `/v1` load with py-spy (raw format, for flame graphs and top
entries). Figures only; nothing is asserted.

    python scripts/bench_cpu.py [--seconds 5] [--agents 64] [--profile /tmp/agentd.txt]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from bench_side_by_side import (agentd_daemon, reset_sessions, run_python, run_wrk,  # noqa: E402
                                seed_memory, spawn_agents, start_process, wait_quiet, wait_up)
from support import free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid`, in seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def measure(load, pid: int, base: str, targets: list, conns: int, seconds: float) -> dict:
    """Run one load cell and add the server's CPU ms per answered request."""
    before = cpu_seconds(pid)
    result = load(base, targets, conns, seconds)
    spent = cpu_seconds(pid) - before
    answered = result["rps"] * seconds
    result["cpu_ms"] = spent * 1000 / max(1.0, answered)
    return result


def default_row(args: argparse.Namespace, load, conn_counts: list[int], upstream: str, tmp: Path,
                extra: str = "") -> dict:
    """`/v1` on a daemon as installed (auto-remember and recall on), its agents holding a few
    facts each (as bench_side_by_side.py's default rows); the embedding the worker does after
    each answer is counted: each cell ends when the daemon has gone quiet."""
    d = agentd_daemon(tmp, upstream, "\n[memory]\nauto_remember = true\n" + extra)
    try:
        names, ids = spawn_agents(d, args.agents)
        seed_memory(d, ids)
        body = '{"messages": [{"role": "user", "content": "hello"}], "stream": false, "model": "agentd:%s"}'
        v1 = [("/v1/chat/completions", body % n) for n in names]
        load(d.url, v1, 1, 1.0)  # warm-up: what the first requests load
        cells = {}
        for conns in conn_counts:
            reset_sessions(d, ids)
            wait_quiet(d.proc.pid)
            before = cpu_seconds(d.proc.pid)
            result = load(d.url, v1, conns, args.seconds)
            wait_quiet(d.proc.pid)
            result["cpu_ms"] = (cpu_seconds(d.proc.pid) - before) * 1000 / max(1.0, result["rps"] * args.seconds)
            cells[conns] = result
        return cells
    finally:
        d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--conns", default="1,32")
    parser.add_argument("--python-load", action="store_true")
    parser.add_argument("--profile", default="", help="py-spy raw output file for agentd under /v1 load")
    parser.add_argument("--auto-remember", action="store_true",
                        help="keep [memory] auto_remember on (embeds every exchange in the background)")
    parser.add_argument("--only", default="", help="comma list of setups: bare,v1,default,whole,message,stream,sse")
    args = parser.parse_args()
    load = run_wrk if shutil.which("wrk") and not args.python_load else run_python
    conn_counts = [int(c) for c in args.conns.split(",")]
    upstream_proc, upstream = start_process([sys.executable, str(ROOT / "scripts" / "fast_upstream.py")])
    bare_port = free_port()
    bare = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bare_proxy.py"), str(bare_port), upstream])
    bare_url = f"http://127.0.0.1:{bare_port}"
    tmp = tempfile.TemporaryDirectory()
    d = None
    try:
        wait_up(bare_url + "/v1/chat/completions", "GET")
        d = agentd_daemon(Path(tmp.name), upstream,
                          "" if args.auto_remember else "\n[memory]\nauto_remember = false\n")
        names, ids = spawn_agents(d, args.agents)
        body = '{"messages": [{"role": "user", "content": "hello"}], "stream": %s, "model": "agentd:%s"}'
        v1 = [("/v1/chat/completions", body % ("false", n)) for n in names]
        v1s = [("/v1/chat/completions", body % ("true", n)) for n in names]
        msg = [(f"/api/agents/{i}/message", '{"message": "hello"}') for i in ids]
        sse = [(f"/api/agents/{i}/message/stream", '{"message": "hello"}') for i in ids]
        setups = [("bare", "bare proxy", bare.pid, bare_url, v1),
                  ("v1", "agentd /v1", d.proc.pid, d.url, v1),
                  ("default", "agentd /v1 default", None, None, None),
                  ("whole", "agentd /v1 whole", None, None, None),
                  ("message", "agentd message", d.proc.pid, d.url, msg),
                  ("barestream", "bare proxy stream", bare.pid, bare_url, v1s),
                  ("stream", "agentd /v1 stream", d.proc.pid, d.url, v1s),
                  ("sse", "agentd SSE message", d.proc.pid, d.url, sse)]
        wanted = set(args.only.split(",")) if args.only else None
        rows = []
        for key, label, pid, base, targets in setups:
            if wanted and key not in wanted and key not in ("bare", "barestream"):
                continue
            if key in ("default", "whole"):
                extra = "embed_whole_exchange = true\n" if key == "whole" else ""
                rows.append((label, default_row(args, load, conn_counts, upstream, Path(tmp.name) / key, extra)))
                continue
            cells = {}
            for conns in conn_counts:
                if base == d.url:
                    reset_sessions(d, ids)
                cells[conns] = measure(load, pid, base, targets, conns, args.seconds)
            rows.append((label, cells))
        print(f"\nserver CPU per request ({args.seconds:g} s per cell, {args.agents} agents round-robin)")
        print(f"{'setup':<20} " + " ".join(f"| {'cpu ms@' + str(c):>10} {'-bare':>7} {'x bare':>6} {'rps':>6} {'bad':>4}"
                                             for c in conn_counts))
        ref = {"plain": rows[0][1], "stream": next((c for lbl, c in rows if lbl == "bare proxy stream"), rows[0][1])}
        for label, cells in rows:
            r = ref["stream"] if "stream" in label or "SSE" in label else ref["plain"]
            print(f"{label:<20} " + " ".join(
                f"| {cells[c]['cpu_ms']:>10.3f} {cells[c]['cpu_ms'] - r[c]['cpu_ms']:>+7.3f} "
                f"{cells[c]['cpu_ms'] / r[c]['cpu_ms']:>6.2f} {cells[c]['rps']:>6.0f} {int(cells[c]['bad']):>4}"
                for c in conn_counts))
        if args.profile and shutil.which("py-spy"):
            reset_sessions(d, ids)
            spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "--rate", "500", "--nonblocking", "--gil",
                                    "-o", args.profile,
                                    "--pid", str(d.proc.pid)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            load(d.url, v1 + msg, conn_counts[0], args.seconds * 2)
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
            spy.wait(60)
            print(f"profile written to {args.profile}")
    finally:
        if d is not None:
            d.stop()
        tmp.cleanup()
        bare.terminate()
        bare.wait(10)
        upstream_proc.terminate()
        upstream_proc.wait(10)


if __name__ == "__main__":
    main()
