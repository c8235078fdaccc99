#!/usr/bin/env python3
"""RSS of one daemon over many messages across many agents: it must stay flat after warm-up.

Starts the fake LLM (its own process) and a daemon in a temporary home with the default
configuration (auto-remember and recall on) unless `--memory-off`, spawns `--agents`
agents and sends `--messages` messages, each a new text, to the agents in turn from
`--conns` client threads. Prints the daemon's RSS after the warm-up (`--warmup`
messages, default a tenth) and at every tenth of the rest, and the growth from the
warm-up figure to the end. `--config` adds TOML to config.toml (for instance a smaller
`[memory] index_cache_fragments` or `[agents] cached_sessions`, so that a short run
fills the caches to their bounds during the warm-up).

    python scripts/bench_rss.py [--messages 100000] [--agents 1000] [--conns 8]
    python scripts/bench_rss.py --messages 20000 --config '[memory]
    index_cache_fragments = 2000'
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import FAST_API, Daemon, fake_llm, make_home  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def send(base: str, ids: list[str], first: int, count: int, conns: int) -> int:
    """POST messages first .. first+count-1 (agent k % len(ids), text 'message k'); how
    many were not answered 200."""
    lock = threading.Lock()
    state = {"next": first, "bad": 0}

    def worker() -> None:
        s = requests.Session()
        while True:
            with lock:
                k = state["next"]
                if k >= first + count:
                    return
                state["next"] = k + 1
            r = s.post(f"{base}/api/agents/{ids[k % len(ids)]}/message", json={"message": f"message {k}"},
                       timeout=120)
            if r.status_code != 200:
                with lock:
                    state["bad"] += 1

    threads = [threading.Thread(target=worker) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return state["bad"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--conns", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=0, help="messages before the reference figure "
                        "(default: a tenth of --messages)")
    parser.add_argument("--memory-off", action="store_true", help="[memory] auto_remember = false")
    parser.add_argument("--config", default="", help="more TOML for config.toml")
    args = parser.parse_args()
    warmup = args.warmup or args.messages // 10
    extra = args.config + ("\n[memory]\nauto_remember = false\n" if args.memory_off else "")
    with fake_llm() as fake, tempfile.TemporaryDirectory() as tmp:
        config = (FAST_API + '\n[default_model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
                  f'api_key_env = "OPENAI_API_KEY"\n[provider_urls]\nopenai = "{fake}/v1"\n' + extra)
        d = Daemon(make_home(Path(tmp), config), env_extra={"OPENAI_API_KEY": "bench"}).start()
        try:
            ids = []
            for i in range(args.agents):
                r = d.post("/api/agents", json={"manifest_toml": f'name = "rss-{i}"\nprofile = "minimal"\n'})
                r.raise_for_status()
                ids.append(r.json()["agent_id"])
            print(f"{args.agents} agents, {args.messages} messages ({warmup} warm-up), {args.conns} clients, "
                  f"memory {'off' if args.memory_off else 'on'}; idle RSS {rss_mb(d.proc.pid):.1f} MB", flush=True)
            began = time.perf_counter()
            bad = send(d.url, ids, 0, warmup, args.conns)
            reference = rss_mb(d.proc.pid)
            print(f"after {warmup} messages (warm-up): RSS {reference:.1f} MB", flush=True)
            rest = args.messages - warmup
            step = max(1, rest // 10)
            sent = warmup
            while sent < args.messages:
                count = min(step, args.messages - sent)
                bad += send(d.url, ids, sent, count, args.conns)
                sent += count
                rate = sent / (time.perf_counter() - began)
                print(f"after {sent} messages: RSS {rss_mb(d.proc.pid):.1f} MB ({rate:.0f} messages/s)", flush=True)
            end = rss_mb(d.proc.pid)
            print(f"RSS after warm-up {reference:.1f} MB, at the end {end:.1f} MB: "
                  f"{(end / reference - 1) * 100:+.1f} % ({bad} messages not answered 200)")
        finally:
            d.stop()


if __name__ == "__main__":
    main()
