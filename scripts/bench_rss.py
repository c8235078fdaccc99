#!/usr/bin/env python3
"""RSS of one daemon over many messages across many agents: it must stay flat after warm-up.

Starts the fast canned upstream (scripts/fast_upstream.py, its own process) and a daemon in
a temporary home with the default configuration (auto-remember and recall on) unless
`--memory-off`, spawns `--agents` agents and sends `--messages` messages in all, each a new
text, to the agents in turn from `--conns` client threads.

The warm-up lasts until every bounded cache the daemon reports in GET /api/health/detail
(`caches`: conversations, semantic index fragments, query embeddings) is full, read after
every `--agents` messages (at least 1,000): until then RSS grows with the caches by design.
A cache counts as full at 95 % of its bound (dropping the least recently used agent's index
leaves the fragment cache a little short of it) or, with fewer agents than conversations
cached, once every agent's conversation is; a cache nothing uses (empty) is not waited for.
`--warmup N` fixes the warm-up at N messages
instead. The reference figure is read after the warm-up, then RSS at every tenth of the
rest with the message rate and the caches' fill, and the growth from the reference to the
end. Each figure is read once the daemon has gone quiet (the exchanges queued for memory
are stored) and the memory worker has handed freed heap back a last time, so that it does
not count the moment's backlog. Each reading splits RSS into RssAnon (glibc's main heap and
the other anonymous mappings apart) and RssFile, and gives the SQLite connections open on
the database, the heap SQLite holds (`sqlite_heap_kib`) and the database's size.
`--config` adds TOML to config.toml (for instance `[api] malloc_arenas` or a smaller
`[memory] index_cache_fragments`); the environment is passed on to the daemon
(`MALLOC_ARENA_MAX`).

    python scripts/bench_rss.py [--messages 100000] [--agents 1000] [--conns 4] [--warmup N]
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

from benchlib import (FAST_API, Daemon, fast_upstream, make_home, open_files, rss_mb, rss_parts,  # noqa: E402
                      send_messages, wait_quiet)

FULL = 0.95  # of a cache's bound: full (see the docstring)
# After the daemon goes quiet, the memory worker hands freed heap back to the system once
# more a second after its last batch (agentd/memory/trim.py); a reading before that counts
# the last burst's scratch memory, which swung readings by up to 20 MB.
SETTLE_SECS = 1.5


def settle(pid: int) -> None:
    wait_quiet(pid)
    time.sleep(SETTLE_SECS)


def spawn(d: Daemon, count: int) -> list[str]:
    ids = []
    for i in range(count):
        r = d.post("/api/agents", json={"manifest_toml": f'name = "rss-{i}"\nprofile = "minimal"\n'})
        r.raise_for_status()
        ids.append(r.json()["agent_id"])
    return ids


def text(k: int) -> str:
    return f"message {k}: please note that order {k * 7919 % 100_003} ships on day {k % 28 + 1}"


def caches(d: Daemon) -> dict[str, dict[str, int]]:
    return d.get("/api/health/detail").json()["caches"]


def fill(found: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{name} {c['held']}/{c['bound']}" for name, c in found.items())


def all_full(found: dict[str, dict[str, int]], agents: int) -> bool:
    def full(name: str, c: dict[str, int]) -> bool:
        if c["held"] == 0:  # not in use (memory off)
            return True
        if name == "sessions" and agents < c["bound"]:
            return c["held"] >= agents
        return c["held"] >= FULL * c["bound"]
    return all(full(name, c) for name, c in found.items())


def parts(d: Daemon) -> str:
    """RSS by kind, the SQLite connections open on the database, SQLite's heap and the
    database's size."""
    db = d.home / "data" / "agentd.db"
    p = rss_parts(d.proc.pid)
    heap = d.get("/api/health/detail").json()["sqlite_heap_kib"]
    held = "?" if heap is None else f"{heap / 1024:.1f}"
    return (f"anon {p['anon']:.1f} (heap {p['heap']:.1f}, other {p['other_anon']:.1f}), file {p['file']:.1f} MB; "
            f"{open_files(d.proc.pid, db)} SQLite connections holding {held} MB, "
            f"database {db.stat().st_size / 1e6:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--conns", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=0, help="messages before the reference figure "
                        "(default: until every bounded cache is full)")
    parser.add_argument("--memory-off", action="store_true", help="[memory] auto_remember = false")
    parser.add_argument("--config", default="", help="more TOML for config.toml")
    args = parser.parse_args()
    extra = args.config + ("\n[memory]\nauto_remember = false\n" if args.memory_off else "")
    with fast_upstream() as upstream, tempfile.TemporaryDirectory() as tmp:
        config = (FAST_API + '\n[default_model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
                  f'api_key_env = "OPENAI_API_KEY"\n[provider_urls]\nopenai = "{upstream}"\n' + extra)
        d = Daemon(make_home(Path(tmp), config), env_extra={"OPENAI_API_KEY": "bench"}).start()
        try:
            ids = spawn(d, args.agents)
            pid = d.proc.pid
            arenas = d.get("/api/health/detail").json()["malloc_arenas"]
            print(f"{args.agents} agents, {args.messages} messages, {args.conns} clients, "
                  f"memory {'off' if args.memory_off else 'on'}, malloc arenas {arenas or 'glibc default'}; "
                  f"idle RSS {rss_mb(pid):.1f} MB", flush=True)
            began = time.perf_counter()
            bad, warmup = 0, 0
            chunk = args.warmup or max(1000, args.agents)
            while warmup < args.messages:
                count = min(chunk, args.messages - warmup)
                bad += send_messages(d.url, ids, count, args.conns, first=warmup, text=text)
                warmup += count
                settle(pid)
                found = caches(d)
                if args.warmup or all_full(found, args.agents):
                    break
                print(f"warming up, {warmup} messages: RSS {rss_mb(pid):.1f} MB ({parts(d)}); caches {fill(found)}",
                      flush=True)
            reference = rss_mb(pid)
            print(f"after {warmup} messages (warm-up): RSS {reference:.1f} MB ({parts(d)}; "
                  f"{warmup / (time.perf_counter() - began):.0f} messages/s); caches {fill(found)}", flush=True)
            step = max(1, -(-(args.messages - warmup) // 10))
            sent = warmup
            peak = reference
            while sent < args.messages:
                count = min(step, args.messages - sent)
                at = time.perf_counter()
                bad += send_messages(d.url, ids, count, args.conns, first=sent, text=text)
                rate = count / (time.perf_counter() - at)
                sent += count
                settle(pid)
                now = rss_mb(pid)
                peak = max(peak, now)
                print(f"after {sent} messages: RSS {now:.1f} MB ({parts(d)}; {rate:.0f} messages/s); "
                      f"caches {fill(caches(d))}", flush=True)
            end = rss_mb(pid) if sent > warmup else reference
            print(f"RSS after warm-up {reference:.1f} MB, at the end {end:.1f} MB: "
                  f"{(end / reference - 1) * 100:+.1f} % (highest {peak:.1f} MB); "
                  f"{bad} messages not answered 200; {time.perf_counter() - began:.0f} s in all")
        finally:
            d.stop()


if __name__ == "__main__":
    main()
