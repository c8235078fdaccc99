#!/usr/bin/env python3
"""RSS of one daemon over many messages across many agents: it must stay flat after warm-up.

Starts the fast canned upstream (scripts/fast_upstream.py, its own process) and a daemon in
a temporary home with the default configuration (auto-remember and recall on) unless
`--memory-off`, spawns `--agents` agents and sends `--messages` messages, each a new text,
to the agents in turn from `--conns` client threads. Prints the daemon's RSS after the
warm-up (`--warmup` messages, default a fifth: each message adds a fragment to memory, so
with the defaults the search index cache has reached its 20,000-fragment bound by then) and
at every tenth of the rest, with the message rate, and the growth from the warm-up figure to
the end. Each figure is read once
the daemon has gone quiet (the exchanges queued for memory are stored), so that it does not
count the moment's backlog. `--config` adds TOML to config.toml (for instance a smaller
`[memory] index_cache_fragments` or `[agents] cached_sessions`).

    python scripts/bench_rss.py [--messages 100000] [--agents 1000] [--conns 4]
    python scripts/bench_rss.py --messages 20000 --config '[memory]
    index_cache_fragments = 2000'
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (FAST_API, Daemon, fast_upstream, make_home, rss_mb, send_messages,  # noqa: E402
                      wait_quiet)


def spawn(d: Daemon, count: int) -> list[str]:
    ids = []
    for i in range(count):
        r = d.post("/api/agents", json={"manifest_toml": f'name = "rss-{i}"\nprofile = "minimal"\n'})
        r.raise_for_status()
        ids.append(r.json()["agent_id"])
    return ids


def text(k: int) -> str:
    return f"message {k}: please note that order {k * 7919 % 100_003} ships on day {k % 28 + 1}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--conns", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=0, help="messages before the reference figure "
                        "(default: a fifth of --messages)")
    parser.add_argument("--memory-off", action="store_true", help="[memory] auto_remember = false")
    parser.add_argument("--config", default="", help="more TOML for config.toml")
    args = parser.parse_args()
    warmup = args.warmup or args.messages // 5
    extra = args.config + ("\n[memory]\nauto_remember = false\n" if args.memory_off else "")
    with fast_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        config = (FAST_API + '\n[default_model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
                  f'api_key_env = "OPENAI_API_KEY"\n[provider_urls]\nopenai = "{upstream}"\n' + extra)
        d = Daemon(make_home(Path(tmp), config), env_extra={"OPENAI_API_KEY": "bench"}).start()
        try:
            ids = spawn(d, args.agents)
            pid = d.proc.pid
            print(f"{args.agents} agents, {args.messages} messages ({warmup} warm-up), {args.conns} clients, "
                  f"memory {'off' if args.memory_off else 'on'}; idle RSS {rss_mb(pid):.1f} MB", flush=True)
            began = time.perf_counter()
            bad = send_messages(d.url, ids, warmup, args.conns, text=text)
            wait_quiet(pid)
            reference = rss_mb(pid)
            print(f"after {warmup} messages (warm-up): RSS {reference:.1f} MB "
                  f"({warmup / (time.perf_counter() - began):.0f} messages/s)", flush=True)
            step = max(1, (args.messages - warmup) // 10)
            sent = warmup
            peak = reference
            while sent < args.messages:
                count = min(step, args.messages - sent)
                at = time.perf_counter()
                bad += send_messages(d.url, ids, count, args.conns, first=sent, text=text)
                rate = count / (time.perf_counter() - at)
                sent += count
                wait_quiet(pid)
                now = rss_mb(pid)
                peak = max(peak, now)
                print(f"after {sent} messages: RSS {now:.1f} MB ({rate:.0f} messages/s)", flush=True)
            end = rss_mb(pid)
            print(f"RSS after warm-up {reference:.1f} MB, at the end {end:.1f} MB: "
                  f"{(end / reference - 1) * 100:+.1f} % (highest {peak:.1f} MB); "
                  f"{bad} messages not answered 200; {time.perf_counter() - began:.0f} s in all")
        finally:
            d.stop()


if __name__ == "__main__":
    main()
