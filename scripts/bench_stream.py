#!/usr/bin/env python3
"""Streaming benchmark: what each live transport adds on top of the model's own stream.

With the fake LLM streaming N chunks at a fixed pace (in its own process), prints:
- time to first chunk at the client through SSE, WebSocket and /v1 streaming, minus the
  time to first chunk when calling the fake LLM directly (p50 and p90 of the difference);
- chunks/s sustained through SSE with 1 and 32 concurrent streams;
- /v1/chat/completions non-stream requests/s next to the fake LLM called directly, as a ratio;
- the same ratio for LiteLLM's proxy in front of the same fake LLM, when `litellm` is installed.
Figures only; nothing is asserted.

    python scripts/bench_stream.py [--runs 30] [--chunks 20] [--pace-ms 5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from typing import Callable

import requests
import websocket

from benchlib import bench_daemon, fake_llm, free_port, percentile, summary, timed_loop


def first_sse_data(response: requests.Response, accept: Callable[[str], bool]) -> tuple[float, int]:
    """Seconds until the first accepted `data:` line, and how many were accepted in all."""
    first, count = 0.0, 0
    for line in response.iter_lines(chunk_size=1, decode_unicode=True):
        if line and line.startswith("data:") and accept(line[5:].strip()):
            count += 1
            if count == 1:
                first = time.perf_counter()
    return first, count


def openai_content(data: str) -> bool:
    if data == "[DONE]":
        return False
    choices = json.loads(data).get("choices") or []
    return bool(choices and (choices[0].get("delta") or {}).get("content"))


LITELLM_KEY = "sk-agentd-bench-0123456789abcdef"


def litellm_ratio(fake_url: str, seconds: float, direct_call: Callable[[int], None], binary: str) -> None:
    """The same non-stream load through LiteLLM's proxy, when its binary is available."""
    binary = binary or shutil.which("litellm") or ""
    if not binary:
        print("LiteLLM proxy comparison: skipped (no `litellm` binary; pass --litellm PATH)")
        return
    port = free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as cfg:
        cfg.write("model_list:\n  - model_name: fake\n    litellm_params:\n"
                  f"      model: openai/gpt-4o\n      api_base: {fake_url}/v1\n      api_key: bench\n")
    proc = subprocess.Popen([binary, "--config", cfg.name, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                                 "LITELLM_MASTER_KEY": LITELLM_KEY})
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                requests.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.5)
        else:
            print("LiteLLM proxy comparison: skipped (the proxy did not start)")
            return
        sessions = [requests.Session() for _ in range(8)]
        for s in sessions:
            s.headers["Authorization"] = f"Bearer {LITELLM_KEY}"
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}

        def via_litellm(i: int) -> None:
            sessions[i].post(url, json=body, timeout=30).raise_for_status()

        for clients in (1, 8):
            d_rate, _ = summary(timed_loop(direct_call, clients, seconds), seconds)
            l_rate, l_p50 = summary(timed_loop(via_litellm, clients, seconds), seconds)
            print(f"LiteLLM proxy non-stream, {clients} client(s): {l_rate:.0f}/s (p50 {l_p50:.2f} ms): "
                  f"ratio to direct {l_rate / d_rate:.2f}")
    finally:
        proc.terminate()
        proc.wait(20)
        os.unlink(cfg.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--pace-ms", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--litellm", default="", help="path of a `litellm` proxy binary to compare with")
    args = parser.parse_args()
    prompt = f"[[chunks:{args.chunks}]] [[pace:{args.pace_ms}]]"

    with fake_llm() as fake_url, bench_daemon(fake_url) as daemon:
        ids = [daemon.post("/api/agents", json={"manifest_toml": f'name = "s{i}"\nprofile = "minimal"\n'})
               .json()["agent_id"] for i in range(32)]
        session = requests.Session()
        headers = {"Accept": "text/event-stream"}

        def direct() -> tuple[float, int]:
            began = time.perf_counter()
            with session.post(f"{fake_url}/v1/chat/completions", stream=True,
                              json={"model": "gpt-4o", "stream": True,
                                    "messages": [{"role": "user", "content": prompt}]}) as r:
                first, n = first_sse_data(r, openai_content)
            return first - began, n

        def sse(agent: str, s: requests.Session = session) -> tuple[float, int]:
            began = time.perf_counter()
            with s.post(f"{daemon.url}/api/agents/{agent}/message/stream", json={"message": prompt},
                        headers=headers, stream=True) as r:
                first, n = first_sse_data(r, lambda d: '"done": false' in d or '"done":false' in d)
            return first - began, n

        def v1() -> tuple[float, int]:
            began = time.perf_counter()
            with session.post(f"{daemon.url}/v1/chat/completions", stream=True,
                              json={"model": "s0", "stream": True,
                                    "messages": [{"role": "user", "content": prompt}]}) as r:
                first, n = first_sse_data(r, openai_content)
            return first - began, n

        ws_url = f"{daemon.url.replace('http', 'ws')}/api/agents/{ids[1]}/ws"

        def over_ws() -> tuple[float, int]:
            # A connection per run (opened before the clock starts): the socket's own
            # limit of 10 messages a minute would otherwise answer with error frames.
            ws = websocket.create_connection(ws_url)
            ws.recv()  # connected
            try:
                return ws_turn(ws)
            finally:
                ws.close()

        def ws_turn(ws: websocket.WebSocket) -> tuple[float, int]:
            began = time.perf_counter()
            ws.send(json.dumps({"type": "message", "content": prompt}))
            first, n = 0.0, 0
            while True:
                frame = json.loads(ws.recv())
                if frame["type"] == "text_delta":
                    n += 1
                    if n == 1:
                        first = time.perf_counter()
                elif frame["type"] in ("response", "error"):
                    return first - began, n

        transports = {"direct": direct, "SSE": lambda: sse(ids[0]), "WebSocket": over_ws, "/v1 stream": v1}
        ttfc: dict[str, list[float]] = {name: [] for name in transports}
        for _ in range(args.runs):  # interleaved so drift affects every transport alike
            for name, fn in transports.items():
                first, n = fn()
                ttfc[name].append(first * 1000)
        base = statistics.median(ttfc["direct"])
        print(f"time to first chunk ({args.chunks} chunks, {args.pace_ms} ms pace, {args.runs} runs)")
        print(f"{'transport':>11} | {'p50 ms':>7} {'p90 ms':>7} | added p50 ms")
        for name, values in ttfc.items():
            p50 = statistics.median(values)
            print(f"{name:>11} | {p50:>7.2f} {percentile(values, 90):>7.2f} | "
                  f"{'' if name == 'direct' else f'{p50 - base:.2f}'}")

        for clients in (1, 32):
            sessions = [requests.Session() for _ in range(clients)]
            totals = [0] * clients
            began = time.perf_counter()

            def streamer(i: int) -> None:
                deadline = began + args.seconds
                while time.perf_counter() < deadline:
                    totals[i] += sse(ids[i], sessions[i])[1]

            threads = [threading.Thread(target=streamer, args=(i,)) for i in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - began
            print(f"SSE chunks/s with {clients:>2} concurrent stream(s): {sum(totals) / elapsed:,.0f} "
                  f"(fake LLM pace caps one stream at {1000 / max(args.pace_ms, 0.001):,.0f}/s)")

        plain = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        sessions = [requests.Session() for _ in range(8)]

        def direct_call(i: int) -> None:
            sessions[i].post(f"{fake_url}/v1/chat/completions", json=plain).raise_for_status()

        def agentd_call(i: int) -> None:
            sessions[i].post(f"{daemon.url}/v1/chat/completions",
                             json={**plain, "model": f"s{i}"}).raise_for_status()

        for clients in (1, 8):
            d_rate, d_p50 = summary(timed_loop(direct_call, clients, args.seconds), args.seconds)
            a_rate, a_p50 = summary(timed_loop(agentd_call, clients, args.seconds), args.seconds)
            print(f"/v1 non-stream, {clients} client(s): agentd {a_rate:.0f}/s (p50 {a_p50:.2f} ms) vs direct "
                  f"{d_rate:.0f}/s (p50 {d_p50:.2f} ms): ratio {a_rate / d_rate:.2f}")
        litellm_ratio(fake_url, args.seconds, direct_call, args.litellm)


if __name__ == "__main__":
    main()
