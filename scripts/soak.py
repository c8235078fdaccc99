#!/usr/bin/env python3
"""A soak: hours of mixed traffic against one daemon, with its vital signs on a table.

Starts the fake LLM (tests/fakellm.py, its own process) and a daemon in a temporary home
with the default configuration (memory on), then keeps every kind of traffic going at
once, each from its own client thread at a steady pace:

  message   POST /api/agents/{id}/message
  sse       POST /api/agents/{id}/message/stream, read to the end
  ws        the agent WebSocket: a message and its frames up to `response` (a new
            connection every 10 messages)
  v1        POST /v1/chat/completions with "stream": true, read to [DONE]
  kv        PUT /api/memory/agents/{id}/kv/{key}
  workflow  POST /api/workflows/{id}/run of a two-step workflow
  channel   a signed POST to the webhook channel adapter, answered on a callback
            (the latency is until the callback arrives)
  lifecycle spawn an agent, message it, kill it

Every `--every` minutes it prints one line per interval: the daemon's RSS, open file
descriptors and threads, and per kind the count, p50 and p99 in ms and errors (any
status other than the expected one, a transport error, or a callback that never came).

    python scripts/soak.py [--minutes 60] [--every 5] [--agents 16] [--pause 0.05]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import ROOT, bench_daemon, fake_llm, free_port  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))

from fakes.recorder import Recorder  # noqa: E402

KINDS = ["message", "sse", "ws", "v1", "kv", "workflow", "channel", "lifecycle"]
SECRET = "soak-webhook-secret"


class Stats:
    """Latencies and errors per kind since the last `take()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lat: dict[str, list[float]] = {k: [] for k in KINDS}
        self._err: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.last_error: dict[str, str] = {}

    def ok(self, kind: str, seconds: float) -> None:
        with self._lock:
            self._lat[kind].append(seconds)

    def error(self, kind: str, what: str) -> None:
        with self._lock:
            self._err[kind] += 1
            self.last_error[kind] = what[:200]

    def take(self) -> tuple[dict[str, list[float]], dict[str, int]]:
        with self._lock:
            lat, err = self._lat, self._err
            self._lat = {k: [] for k in KINDS}
            self._err = dict.fromkeys(KINDS, 0)
        return lat, err


def proc_figures(pid: int) -> tuple[float, int, int]:
    """(RSS in MB, open file descriptors, threads) of a process."""
    rss = threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd")), threads


def spawn(base: str, name: str) -> str:
    r = requests.post(f"{base}/api/agents", json={"manifest_toml": f'name = "{name}"\nprofile = "minimal"\n'},
                      timeout=30)
    r.raise_for_status()
    return r.json()["agent_id"]


class Soak:
    def __init__(self, base: str, ids: list[str], names: list[str], workflow: str, hook: str,
                 callback: Recorder, pause: float) -> None:
        self.base, self.ids, self.names = base, ids, names
        self.workflow, self.hook, self.callback = workflow, hook, callback
        self.pause = pause
        self.stats = Stats()
        self.stop = threading.Event()

    def loop(self, kind: str) -> None:
        step = getattr(self, f"_{kind}")
        session = requests.Session()
        n = 0
        state: dict = {}
        while not self.stop.is_set():
            began = time.perf_counter()
            try:
                problem = step(session, n, state)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, the soak goes on
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                self.stats.error(kind, problem)
            else:
                self.stats.ok(kind, time.perf_counter() - began)
            n += 1
            self.stop.wait(self.pause)
        if state.get("ws") is not None:
            state["ws"].close()

    @staticmethod
    def _expect(r: requests.Response, status: int = 200) -> str:
        return "" if r.status_code == status else f"{r.status_code} {r.text[:120]}"

    def _agent(self, n: int) -> str:
        return self.ids[n % len(self.ids)]

    def _message(self, s: requests.Session, n: int, state: dict) -> str:
        return self._expect(s.post(f"{self.base}/api/agents/{self._agent(n)}/message",
                                   json={"message": f"message {n}"}, timeout=60))

    def _sse(self, s: requests.Session, n: int, state: dict) -> str:
        with s.post(f"{self.base}/api/agents/{self._agent(n + 1)}/message/stream",
                    json={"message": f"stream {n}"}, stream=True, timeout=60) as r:
            body = b"".join(r.iter_content(None))
        if r.status_code != 200:
            return f"{r.status_code} {body[:120]!r}"
        return "" if b"event: done" in body or b'"done"' in body else f"no done event: {body[-120:]!r}"

    def _ws(self, s: requests.Session, n: int, state: dict) -> str:
        import websocket

        if n % 10 == 0 and state.get("ws") is not None:
            state.pop("ws").close()
        if state.get("ws") is None:
            agent = self._agent(n + 2)
            ws = websocket.create_connection(self.base.replace("http://", "ws://") + f"/api/agents/{agent}/ws",
                                             timeout=60)
            first = json.loads(ws.recv())
            if first.get("type") != "connected":
                ws.close()
                return f"first frame {first}"
            state["ws"] = ws
        ws = state["ws"]
        ws.send(json.dumps({"type": "message", "content": f"socket {n}"}))
        while True:
            frame = json.loads(ws.recv())
            if frame["type"] == "response":
                return ""
            if frame["type"] == "error":
                return f"error frame {frame}"

    def _v1(self, s: requests.Session, n: int, state: dict) -> str:
        body = {"model": f"agentd:{self.names[(n + 3) % len(self.names)]}", "stream": True,
                "messages": [{"role": "user", "content": f"v1 {n}"}]}
        with s.post(f"{self.base}/v1/chat/completions", json=body, stream=True, timeout=60) as r:
            data = b"".join(r.iter_content(None))
        if r.status_code != 200:
            return f"{r.status_code} {data[:120]!r}"
        return "" if b"data: [DONE]" in data else f"no [DONE]: {data[-120:]!r}"

    def _kv(self, s: requests.Session, n: int, state: dict) -> str:
        return self._expect(s.put(f"{self.base}/api/memory/agents/{self._agent(n)}/kv/key-{n % 100}",
                                  json={"n": n, "text": "soak"}, timeout=60))

    def _workflow(self, s: requests.Session, n: int, state: dict) -> str:
        r = s.post(f"{self.base}/api/workflows/{self.workflow}/run", json={"input": f"run {n}"}, timeout=120)
        if r.status_code != 200:
            return f"{r.status_code} {r.text[:120]}"
        status = r.json().get("status")
        return "" if status == "completed" else f"workflow {status}: {r.text[:120]}"

    def _channel(self, s: requests.Session, n: int, state: dict) -> str:
        text = f"channel {n}"
        body = json.dumps({"sender_id": f"soak-{n % 8}", "message": text}).encode()
        signature = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        seen = len(self.callback.requests)
        r = s.post(self.hook, data=body, timeout=60,
                   headers={"X-Webhook-Signature": signature, "Content-Type": "application/json"})
        if r.status_code != 202:
            return f"{r.status_code} {r.text[:120]}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(text.encode() in c["body"] for c in self.callback.requests[seen:]):
                del self.callback.requests[:-100]  # (the recorder keeps every request)
                return ""
            time.sleep(0.005)
        return "no callback within 60 s"

    def _lifecycle(self, s: requests.Session, n: int, state: dict) -> str:
        agent = spawn(self.base, f"soak-temp-{n}")
        problem = self._expect(s.post(f"{self.base}/api/agents/{agent}/message", json={"message": "hi"},
                                      timeout=60))
        return problem or self._expect(s.delete(f"{self.base}/api/agents/{agent}", timeout=60))


def ms(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000 if ordered else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the soak runs")
    parser.add_argument("--every", type=float, default=5.0, help="minutes between two printed rows")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds each client waits between calls")
    args = parser.parse_args()

    callback = Recorder()
    with fake_llm() as fake, bench_daemon(fake, env={"SOAK_WEBHOOK_SECRET": SECRET}) as d:
        base = d.url
        names = [f"soak-{i}" for i in range(args.agents)]
        ids = [spawn(base, name) for name in names]
        steps = [{"name": "draft", "agent_name": names[0], "prompt": "{{input}}"},
                 {"name": "check", "agent_name": names[1], "prompt": "check: {{input}}"}]
        r = requests.post(f"{base}/api/workflows", json={"name": "soak", "steps": steps}, timeout=30)
        r.raise_for_status()
        workflow = r.json()["workflow_id"]
        port = free_port()
        r = requests.post(f"{base}/api/channels/webhook/configure", timeout=30,
                          json={"listen_port": port, "callback_url": callback.url + "/cb",
                                "secret_env": "SOAK_WEBHOOK_SECRET", "default_agent": names[2]})
        r.raise_for_status()
        hook = f"http://127.0.0.1:{port}/webhook"
        deadline = time.monotonic() + 30
        while not any(c["name"] == "webhook" and c["active"] for c in requests.get(f"{base}/api/channels").json()):
            if time.monotonic() > deadline:
                raise SystemExit("the webhook channel never became active")
            time.sleep(0.1)

        soak = Soak(base, ids, names, workflow, hook, callback, args.pause)
        threads = [threading.Thread(target=soak.loop, args=(kind,), daemon=True) for kind in KINDS]
        for t in threads:
            t.start()
        began = time.monotonic()
        print(f"soak: {args.minutes:g} min, a row every {args.every:g} min, {args.agents} agents, "
              f"{args.pause:g} s between a client's calls; default configuration (memory on)")
        head = f"{'min':>5} {'RSS MB':>7} {'FDs':>4} {'thr':>4} | " + " | ".join(
            f"{k:>9} n p50/p99 err" for k in KINDS)
        print(head, flush=True)
        rows = 0
        total_errors = 0
        while True:
            rows += 1
            due = began + rows * args.every * 60
            end = began + args.minutes * 60
            time.sleep(max(0.0, min(due, end) - time.monotonic()))
            lat, err = soak.stats.take()
            rss, fds, nthreads = proc_figures(d.proc.pid)
            cells = []
            for k in KINDS:
                total_errors += err[k]
                cells.append(f"{len(lat[k]):>5} {ms(lat[k], 50):>5.0f}/{ms(lat[k], 99):<5.0f} {err[k]:>3}")
            print(f"{(time.monotonic() - began) / 60:>5.1f} {rss:>7.1f} {fds:>4} {nthreads:>4} | "
                  + " | ".join(cells), flush=True)
            if time.monotonic() >= end - 1:
                break
        soak.stop.set()
        for t in threads:
            t.join(120)
        print(f"errors in all: {total_errors}")
        for kind, what in soak.stats.last_error.items():
            print(f"  last {kind} error: {what}")
    callback.close()


if __name__ == "__main__":
    main()
