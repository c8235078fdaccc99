#!/usr/bin/env python3
"""The request path's own work per `/v1` (or `POST /message`) request, in process.

A kernel and its Flask app serve requests handed straight to the WSGI app (no server, no
load generator) from one thread, each answered through the real drivers by the fast canned
upstream (`scripts/fast_upstream.py`, its own process), with memory off. Printed: the
calling thread's CPU per request (each round, and the least: on a busy machine the least is
the one other processes disturbed least), then, with `--opcodes`, the Python bytecode
instructions run per request, in all and by file: a count that does not move with the
machine's load, so a change to the request path can be weighed on a busy host. (The C
parts, JSON, SQLite and system calls, count as the single instruction that called them.)
The bare Flask + requests proxy's app (`scripts/bare_proxy.py`) is measured the same way in
the same run, as the reference: its least CPU, its instruction count and agentd's ratio to each.
`--write` times the message's write transaction on SQLite: its opening, each statement and
its commit, in thread CPU per request over the measured rounds.

    python scripts/bench_request_path.py [--route v1|message] [--requests 2000] [--rounds 5]
                                         [--opcodes] [--top 30] [--by-function] [--write]
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_side_by_side import start_process  # noqa: E402

AGENTS = 64
LOCAL = {"REMOTE_ADDR": "127.0.0.1"}


def _short(path: str) -> str:
    for marker in ("site-packages/", "/agentd/"):
        if marker in path:
            rest = path.split(marker, 1)[1]
            return "agentd/" + rest if marker == "/agentd/" else rest
    if "/lib/python" in path:  # the standard library
        return path.split("/lib/python", 1)[1].split("/", 1)[-1]
    return path


class Harness:
    """Hands requests straight to a WSGI app and measures them."""

    def __init__(self, app, environs: list[tuple[dict, bytes]], reset=lambda: None) -> None:
        self.app, self.environs, self.reset, self.statuses = app, environs, reset, []

    def start_response(self, status: str, headers: list, exc_info: object = None) -> object:
        self.statuses.append(status)
        return lambda data: None

    def one(self, i: int) -> None:
        base, body = self.environs[i % len(self.environs)]
        environ = dict(base)
        environ["wsgi.input"] = io.BytesIO(body)
        answer = self.app(environ, self.start_response)
        for _ in answer:
            pass
        getattr(answer, "close", lambda: None)()

    def cpu(self, requests: int, rounds: int) -> list[float]:
        """The thread's CPU ms per request, each round (after an unrecorded warm-up)."""
        for i in range(300):  # warm-up: connections, caches, lazy imports
            self.one(i)
        cpu = []
        for _ in range(rounds):
            self.reset()
            self.statuses.clear()
            began = time.thread_time()
            for i in range(requests):
                self.one(i)
            cpu.append((time.thread_time() - began) * 1000 / requests)
            if not all(s.startswith("200") for s in self.statuses):
                raise SystemExit(f"not every request answered 200: {sorted(set(self.statuses))}")
        return cpu

    def opcodes(self, traced: int, by_function: bool) -> collections.Counter[str]:
        """Bytecode instructions run by `traced` requests, by file (or function)."""
        counts: collections.Counter[str] = collections.Counter()

        def trace(frame, event, arg):  # noqa: ANN001 - sys.settrace's signature
            code = frame.f_code
            key = _short(code.co_filename) + (f":{code.co_name}" if by_function else "")
            frame.f_trace_opcodes, frame.f_trace_lines = True, False

            def local(frame, event, arg):  # noqa: ANN001
                if event == "opcode":
                    counts[key] += 1
                return local
            return local

        self.reset()
        sys.settrace(trace)
        try:
            for i in range(traced):
                self.one(i)
        finally:
            sys.settrace(None)
        return counts


def time_the_write() -> dict[str, list[float]]:
    """Wrap the SQLite writer so each transaction's opening, statements and commit add their
    thread CPU (and count) to the dict returned, by the statement's first words."""
    from agentd.store import writer

    spent: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])

    def add(key: str, began: float) -> None:
        entry = spent[key]
        entry[0] += 1
        entry[1] += time.thread_time() - began

    execute, transaction = writer.SqliteTx.execute, writer.SqliteWriter._transaction

    def timed_execute(self, sql: str, params: dict) -> int:  # noqa: ANN001
        began = time.thread_time()
        try:
            return execute(self, sql, params)
        finally:
            add(" ".join(sql.split()[:3]), began)

    def timed_transaction(self, work):  # noqa: ANN001
        def steps(tx):  # noqa: ANN001
            began = time.thread_time()
            self.conn.execute("BEGIN IMMEDIATE")
            add("BEGIN", began)
            result = work(tx)
            began = time.thread_time()
            self.conn.commit()
            add("COMMIT", began)
            return result

        began = time.thread_time()
        try:
            return transaction(self, steps)
        finally:
            add("the whole transaction", began)

    writer.SqliteTx.execute, writer.SqliteWriter._transaction = timed_execute, timed_transaction
    return spent


def environ(path: str, body: bytes) -> tuple[dict, bytes]:
    from werkzeug.test import EnvironBuilder

    return (EnvironBuilder(path=path, method="POST", data=body, content_type="application/json",
                           headers={"Host": "127.0.0.1"}, environ_base=LOCAL).get_environ(), body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=("v1", "message"), default="v1")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--opcodes", action="store_true", help="count bytecode instructions per request")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--by-function", action="store_true", help="count by function, not by file")
    parser.add_argument("--write", action="store_true", help="time the write transaction's steps")
    args = parser.parse_args()

    os.environ["OPENAI_API_KEY"] = "bench"
    upstream_proc, upstream = start_process([sys.executable, str(ROOT / "scripts" / "fast_upstream.py")])
    import bare_proxy

    from agentd.api import create_app
    from agentd.config import parse_config
    from agentd.kernel import Kernel

    tmp = tempfile.TemporaryDirectory()
    config = {"api": {"rate_limit_per_second": 100000, "rate_limit_burst": 100000},
              "memory": {"auto_remember": False},
              "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "OPENAI_API_KEY"},
              "provider_urls": {"openai": upstream}}
    kernel = Kernel.open(parse_config(config, Path(tmp.name)))
    try:
        app = create_app(kernel)
        client = app.test_client()
        ids = []
        for i in range(AGENTS):
            r = client.post("/api/agents", json={"manifest_toml": f'name = "bench-{i}"\nprofile = "minimal"\n'},
                            environ_base=LOCAL)
            ids.append(r.get_json()["agent_id"])
        if args.route == "v1":
            targets = [("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hello"}], '
                        b'"stream": false, "model": "agentd:bench-%d"}' % i) for i in range(AGENTS)]
        else:
            targets = [(f"/api/agents/{i}/message", b'{"message": "hello"}') for i in ids]

        def reset() -> None:
            for agent_id in ids:
                client.post(f"/api/agents/{agent_id}/session/reset", environ_base=LOCAL)

        agentd = Harness(app, [environ(path, body) for path, body in targets], reset)
        write = time_the_write() if args.write else None
        bare = Harness(bare_proxy.build(upstream), [environ("/v1/chat/completions", b'{"messages": [{"role": '
                                                            b'"user", "content": "hello"}], "stream": false}')])
        rows = [("agentd " + args.route, agentd.cpu(args.requests, args.rounds)),
                ("bare proxy", bare.cpu(args.requests, args.rounds))]
        print(f"thread CPU ms per request, {args.requests} requests a round:")
        for label, cpu in rows:
            print(f"  {label:<14} " + " ".join(f"{c:.3f}" for c in cpu) + f" (least {min(cpu):.3f})")
        print(f"  agentd / bare: {min(rows[0][1]) / min(rows[1][1]):.2f}")
        if write is not None:
            measured = args.requests * args.rounds
            print("the write, thread CPU µs per request (warm-up included):")
            for key, (count, spent) in sorted(write.items(), key=lambda kv: -kv[1][1]):
                print(f"  {spent * 1e6 / (measured + 300):7.1f}  {key} ({count / (measured + 300):.2f} a request)")
        if args.opcodes:
            traced = min(args.requests, 300)
            counts = agentd.opcodes(traced, args.by_function)
            reference = sum(bare.opcodes(traced, False).values()) / traced
            total = sum(counts.values()) / traced
            print(f"bytecode instructions per request: {total:.0f} (bare proxy {reference:.0f}, "
                  f"agentd / bare {total / reference:.2f})")
            for key, n in counts.most_common(args.top):
                print(f"{n / traced:9.0f}  {key}")
    finally:
        kernel.close()
        tmp.cleanup()
        upstream_proc.terminate()
        upstream_proc.wait(10)


if __name__ == "__main__":
    main()
