"""Providers and clients that misbehave, through the real daemon.

Every test drives `python -m agentd start` against tests/misbehaving_upstream.py
(hang, drip, stall, cut, close-delimited, 429/503, reset). Time bounds are the ones the
issue names, each with slack; nothing else about speed is asserted.
"""

from __future__ import annotations

import json
import re
import socket
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
import websocket

from conftest import LLM_ENV, NO_REMEMBERING
from misbehaving_upstream import Upstream
from support import Daemon, make_home

TIMEOUT = 2  # [llm] timeout_secs of the fast daemon
IDLE = 1.5  # [llm] stream_idle_secs (above the 1 s spacing of the framing tests)
MAX_QUEUE = 3
SLOW_THREADS = 320
SLACK = 1.0  # added to every bound the issue names

RATE = "rate_limit_per_second = 100000\nrate_limit_burst = 100000\nshutdown_grace_secs = 5\n"
# Remembering exchanges loads an embedding model in the background, whose thread pool appears
# at an unpredictable moment after the first answer: off (NO_REMEMBERING), so thread counts
# measure runs only.
FAST = (f"[api]\n{RATE}\n[llm]\ntimeout_secs = {TIMEOUT}\nstream_idle_secs = {IDLE}\nretries = 3\n"
        f"\n[agents]\nmax_queue = {MAX_QUEUE}\n" + NO_REMEMBERING)
# Calls that hang long enough to watch what else happens meanwhile; room for 200 held requests
# (150 of them waiting behind a hung run: max_streams less its reserved quarter, agentd/server/slots.py).
SLOW = (f"[api]\n{RATE}threads = {SLOW_THREADS}\nmax_streams = 270\n\n[llm]\ntimeout_secs = 60\nstream_idle_secs = 30\n"
        f"\n[agents]\nmax_queue = {MAX_QUEUE}\n" + NO_REMEMBERING)


@pytest.fixture(scope="module")
def up() -> Iterator[Upstream]:
    server = Upstream().start()
    yield server
    server.stop()


def _daemon(tmp_path_factory: pytest.TempPathFactory, config: str) -> Daemon:
    return Daemon(make_home(tmp_path_factory.mktemp("faults"), config), env_extra=LLM_ENV).start()


@pytest.fixture(scope="module")
def fast(tmp_path_factory) -> Iterator[Daemon]:
    d = _daemon(tmp_path_factory, FAST)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def slow(tmp_path_factory) -> Iterator[Daemon]:
    d = _daemon(tmp_path_factory, SLOW)
    yield d
    d.stop()


# -- helpers ------------------------------------------------------------------------------

def spawn(d: Daemon, up: Upstream, fault: str, anthropic: bool = False) -> tuple[str, str]:
    """An agent whose provider is `up` with `fault`; returns (id, name)."""
    name = f"f-{uuid.uuid4().hex[:8]}"
    model = ('provider = "anthropic"\nmodel = "claude-sonnet-4-6"' if anthropic
             else 'provider = "openai"\nmodel = "gpt-4o"')
    toml = f'name = "{name}"\nprofile = "minimal"\n[model]\n{model}\nbase_url = "{up.base(fault, anthropic)}"\n'
    r = d.post("/api/agents", json={"manifest_toml": toml})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"], name


def threads(d: Daemon) -> int:
    """Live threads of the daemon process."""
    status = Path(f"/proc/{d.proc.pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))


def settle(d: Daemon, baseline: int, timeout: float = 5.0) -> int:
    """Wait for the thread count to come back to `baseline`; returns the last count."""
    deadline = time.monotonic() + timeout
    while True:
        count = threads(d)
        if count <= baseline or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def warm_baseline(d: Daemon, up: Upstream) -> int:
    """Idle thread count after a plain, a streamed and a WebSocket run (pools have their
    workers: the first two run on the request's thread, a WebSocket's on the run pool)."""
    agent_id, _ = spawn(d, up, "ok")
    assert d.post(f"/api/agents/{agent_id}/message", json={"message": "warm"}).status_code == 200
    list(sse(sse_open(d, agent_id, "warm")))
    ws = ws_open(d, agent_id)
    ws.send(json.dumps({"type": "message", "content": "warm"}))
    while json.loads(ws.recv())["type"] not in ("response", "error"):
        pass
    ws.close()
    # Idle means stable: the same count for half a second.
    count, since, deadline = threads(d), time.monotonic(), time.monotonic() + 10
    while time.monotonic() - since < 0.5 and time.monotonic() < deadline:
        time.sleep(0.05)
        now = threads(d)
        if now != count:
            count, since = now, time.monotonic()
    return count


def sse_open(d: Daemon, agent_id: str, text: str) -> requests.Response:
    r = requests.post(f"{d.url}/api/agents/{agent_id}/message/stream", json={"message": text},
                      stream=True, timeout=60)
    assert r.status_code == 200, r.text
    return r


def sse(r: requests.Response) -> Iterator[tuple[float, str, Any]]:
    """(arrival time, event, data) as events arrive (read1: nothing is held back)."""
    buf, event, data = b"", "", []
    while True:
        chunk = r.raw.read1(65536)
        if not chunk:
            return
        now = time.time()
        buf += chunk
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            line = raw.rstrip(b"\r").decode()
            if not line:
                if data:
                    text = "\n".join(data)
                    yield now, event or "message", (text if text == "[DONE]" else json.loads(text))
                event, data = "", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())


def v1_open(d: Daemon, name: str, text: str, stream: bool = True) -> requests.Response:
    return requests.post(f"{d.url}/v1/chat/completions", stream=stream, timeout=60,
                         json={"model": f"agentd:{name}", "stream": stream,
                               "messages": [{"role": "user", "content": text}]})


def ws_open(d: Daemon, agent_id: str) -> websocket.WebSocket:
    ws = websocket.create_connection(f"{d.url.replace('http://', 'ws://')}/api/agents/{agent_id}/ws", timeout=30)
    assert json.loads(ws.recv())["type"] == "connected"
    return ws


def session_texts(d: Daemon, agent_id: str) -> list[tuple[str, str]]:
    return [(m["role"].lower(), m.get("content") or "") for m in d.get(f"/api/agents/{agent_id}/session").json()["messages"]]


def failure_line(d: Daemon, name: str, timeout: float = 3.0) -> str:
    """The daemon's one log line for a failed run of agent `name`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in d.log().splitlines() if f"run failed: agent={name} " in line]
        if lines:
            assert len(lines) == 1, lines
            return lines[0]
        time.sleep(0.05)
    raise AssertionError(f"no failure line for {name} in the daemon log")


def p50(fn, n: int = 30) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# -- 1. one deadline per model call ----------------------------------------------------------

@pytest.mark.parametrize("fault", ["hang", "drip"])
def test_hang_and_drip_fail_within_the_deadline(fast, up, fault) -> None:
    agent_id, name = spawn(fast, up, fault)
    started = time.monotonic()
    r = fast.post(f"/api/agents/{agent_id}/message", json={"message": "hi"})
    elapsed = time.monotonic() - started
    assert r.status_code == 504 and "timed out after 2s" in r.json()["error"]
    assert elapsed < TIMEOUT + 1 + SLACK
    line = failure_line(fast, name)
    assert "provider=openai model=gpt-4o status=504" in line and "timed out" in line
    assert re.search(r"duration=\d+\.\d\ds$", line)


def test_v1_timeout_is_an_openai_error(fast, up) -> None:
    _, name = spawn(fast, up, "hang")
    started = time.monotonic()
    r = v1_open(fast, name, "hi", stream=False)
    assert time.monotonic() - started < TIMEOUT + 1 + SLACK
    assert r.status_code == 504
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code"} and "timed out" in error["message"]
    assert error["type"] == "server_error" and error["code"] == "upstream_timeout"
    # agentd already spent the retries the deadline allowed: clients must not multiply them.
    assert r.headers["x-should-retry"] == "false"


def test_dripping_stream_fails_within_the_deadline(fast, up) -> None:
    agent_id, name = spawn(fast, up, "drip")
    started = time.monotonic()
    events = list(sse(sse_open(fast, agent_id, "hi")))
    assert time.monotonic() - started < TIMEOUT + 1 + SLACK
    assert events[-1][1] == "error" and events[-1][2]["status"] == 504
    assert "timed out after 2s" in events[-1][2]["error"]
    assert "status=504" in failure_line(fast, name)


@pytest.mark.parametrize("anthropic", [False, True])
def test_stream_stalled_mid_way_fails_after_the_idle_limit(fast, up, anthropic) -> None:
    agent_id, name = spawn(fast, up, "stall", anthropic)
    events = list(sse(sse_open(fast, agent_id, "stall please")))
    chunks = [e for e in events if e[1] == "chunk"]
    assert [c[2]["content"] for c in chunks] == ["tok1 "]
    kinds = [e[1] for e in events]
    assert kinds[-1] == "error" and "done" not in kinds
    error = events[-1][2]
    assert error["status"] == 504 and f"no data for {IDLE}s" in error["error"]
    # The error came about IDLE after the chunk: the stall, not the whole-call deadline.
    assert events[-1][0] - chunks[0][0] < IDLE + SLACK
    # A failure after part of the stream was sent still logs its line.
    line = failure_line(fast, name)
    assert "stalled" in line and ("provider=anthropic" if anthropic else "provider=openai") in line
    # The session keeps the question and a failure note, never the cut-off reply.
    texts = session_texts(fast, agent_id)
    assert [role for role, _ in texts] == ["user", "assistant"] and texts[0][1] == "stall please"
    assert texts[1][1].startswith("[run failed: ") and "stalled" in texts[1][1] and "tok1" not in texts[1][1]


# -- 2. stop means stop ---------------------------------------------------------------------

def _stop_by(how: str, d: Daemon, agent_id: str, name: str, holder: dict) -> None:
    if how == "stop":
        assert d.post(f"/api/agents/{agent_id}/stop").json()["was_running"] is True
    elif how == "delete":
        assert d.delete(f"/api/agents/{agent_id}").status_code == 200
    elif how == "client-abrupt":  # the peer vanishes: no close frame, just a dead socket
        sock = holder["client"].sock
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    elif "thread" in holder:  # a plain request whose client gave up waiting (its read timed out)
        holder["thread"].join(10)
        assert isinstance(holder["result"].get("error"), requests.ReadTimeout)
        holder["stopped_at"] = holder["result"]["at"]
    else:  # the client goes away
        holder["client"].close()


@pytest.mark.parametrize("how,transport", [("stop", "sse"), ("delete", "sse"), ("client", "sse"),
                                           ("client", "ws"), ("client-abrupt", "ws"), ("client", "v1"),
                                           ("stop", "message"), ("client", "message")])
def test_stopping_closes_the_upstream_and_frees_the_thread(slow, up, how, transport) -> None:
    baseline = warm_baseline(slow, up)
    fault = f"hang-{uuid.uuid4().hex[:6]}"
    agent_id, name = spawn(slow, up, fault)
    holder: dict[str, Any] = {}
    if transport == "sse":
        holder["client"] = sse_open(slow, agent_id, "wait")
    elif transport == "v1":
        holder["client"] = v1_open(slow, name, "wait")
    elif transport == "ws":
        ws = holder["client"] = ws_open(slow, agent_id)
        ws.send(json.dumps({"type": "message", "content": "wait"}))
    else:
        result: dict[str, Any] = {}

        def plain() -> None:
            try:
                result["r"] = requests.post(f"{slow.url}/api/agents/{agent_id}/message", json={"message": "wait"},
                                            timeout=60 if how == "stop" else 1.5)
            except requests.ReadTimeout as exc:
                result["error"], result["at"] = exc, time.time()

        t = holder["thread"] = threading.Thread(target=plain)
        holder["result"] = result
        t.start()
    conn = up.wait_conns(fault, 1)[0]
    assert conn.closed_at is None
    stopped_at = time.time()
    _stop_by(how, slow, agent_id, name, holder)
    stopped_at = holder.get("stopped_at", stopped_at)
    assert conn.done.wait(5)
    assert conn.closed_at - stopped_at < 1 + SLACK / 2
    if transport == "message" and how == "stop":
        t.join(5)
        assert result["r"].status_code == 409
    if how != "client" and transport in ("sse",):
        holder["client"].close()
    assert settle(slow, baseline) <= baseline
    assert len(up.by_fault(fault)) == 1  # a stopped call is not retried


def test_many_stopped_calls_leave_nothing_behind(slow, up) -> None:
    """256 stopped calls used to fill the model-call pool and starve healthy agents."""
    baseline = warm_baseline(slow, up)
    fault = f"hang-{uuid.uuid4().hex[:6]}"
    agent_id, _ = spawn(slow, up, fault)
    for i in range(30):
        r = sse_open(slow, agent_id, f"wait {i}")
        up.wait_conns(fault, i + 1)
        assert slow.post(f"/api/agents/{agent_id}/stop").json()["was_running"] is True
        events = list(sse(r))
        assert events[-1][1] == "done" and events[-1][2]["stopped"] is True
    for conn in up.by_fault(fault):
        assert conn.done.wait(3)
    assert settle(slow, baseline) <= baseline
    detail = slow.get("/api/health/detail").json()
    assert detail["model_calls_in_flight"] == 0 and detail["process_threads"] <= baseline
    healthy, _ = spawn(slow, up, "ok")
    r = slow.post(f"/api/agents/{healthy}/message", json={"message": "still there?"}, timeout=10)
    assert r.status_code == 200 and r.json()["response"] == "hello from upstream"


def test_daemon_shutdown_closes_upstream_connections(tmp_path_factory, up) -> None:
    d = _daemon(tmp_path_factory, SLOW)
    try:
        fault = f"hang-{uuid.uuid4().hex[:6]}"
        agent_id, _ = spawn(d, up, fault)
        client = sse_open(d, agent_id, "wait")
        conn = up.wait_conns(fault, 1)[0]
        stopped_at = time.time()
        d.proc.terminate()
        assert conn.done.wait(5)
        assert conn.closed_at - stopped_at < 1 + SLACK / 2
        assert d.proc.wait(10) == 0
        client.close()
    finally:
        d.kill()


# -- 3. streams are forwarded as they arrive ------------------------------------------------

def _arrivals(d: Daemon, up: Upstream, fault: str, transport: str, anthropic: bool) -> list[float]:
    agent_id, name = spawn(d, up, fault, anthropic)
    times: list[float] = []
    if transport == "sse":
        for at, event, data in sse(sse_open(d, agent_id, "go")):
            if event == "chunk":
                times.append(at)
    elif transport == "v1":
        for at, _, data in sse(v1_open(d, name, "go")):
            assert data == "[DONE]" or "choices" in data, data
            if data != "[DONE]" and data["choices"] and data["choices"][0]["delta"].get("content"):
                times.append(at)
    else:
        ws = ws_open(d, agent_id)
        ws.send(json.dumps({"type": "message", "content": "go"}))
        while True:
            frame = json.loads(ws.recv())
            if frame["type"] == "text_delta":
                times.append(time.time())
            if frame["type"] in ("response", "error"):
                break
        ws.close()
    return times


@pytest.mark.parametrize("framing", ["close", "chunked"])
@pytest.mark.parametrize("transport", ["sse", "ws", "v1"])
def test_streams_are_forwarded_as_they_arrive(fast, up, framing, transport) -> None:
    fault = f"{framing}-1.0-2"  # 1 s apart, within the 2 s deadline
    before = len(up.by_fault(fault))
    arrivals = _arrivals(fast, up, fault, transport, anthropic=transport == "ws")
    sent = [t for t, _ in up.by_fault(fault)[before].sent]
    assert len(arrivals) == len(sent) == 2
    for arrived, left in zip(arrivals, sent):
        # 100 ms is the bound; buffering would show up as a whole second.
        assert arrived - left < 0.1 + 0.25


# -- 4. a truncated stream is an error --------------------------------------------------------

@pytest.mark.parametrize("anthropic", [False, True])
def test_truncated_stream_is_an_error(fast, up, anthropic) -> None:
    agent_id, name = spawn(fast, up, "cut", anthropic)
    marker = "(no message_stop)" if anthropic else "(no [DONE] or finish_reason)"
    events = list(sse(sse_open(fast, agent_id, "cut me")))
    assert [e[2]["content"] for e in events if e[1] == "chunk"] == ["tok1 ", "tok2 "]
    assert events[-1][1] == "error" and "done" not in [e[1] for e in events]
    assert events[-1][2]["status"] == 502 and "cut off" in events[-1][2]["error"]
    assert marker in events[-1][2]["error"]
    # /v1: the content, then an error chunk; never finish_reason "stop".
    chunks = [data for _, _, data in sse(v1_open(fast, name, "cut again"))]
    finishes = [c["choices"][0].get("finish_reason") for c in chunks
                if isinstance(c, dict) and c.get("choices")]
    assert "stop" not in finishes
    assert any(isinstance(c, dict) and "error" in c and "cut off" in c["error"]["message"] for c in chunks)
    # WebSocket: an error frame, no response frame.
    ws = ws_open(fast, agent_id)
    ws.send(json.dumps({"type": "message", "content": "cut thrice"}))
    frames = []
    while not frames or frames[-1]["type"] not in ("response", "error"):
        frames.append(json.loads(ws.recv()))
    ws.close()
    assert frames[-1]["type"] == "error" and "cut off" in frames[-1]["content"]
    r = fast.post(f"/api/agents/{agent_id}/message", json={"message": "cut plain"})
    assert r.status_code == 200  # not streamed: the upstream answers whole JSON
    # The partial replies are not recorded (README: "Faults"): each question is closed by a
    # failure note instead.
    texts = session_texts(fast, agent_id)
    assert [t for role, t in texts if role == "user"] == ["cut me", "cut again", "cut thrice", "cut plain"]
    notes = [t for role, t in texts if role == "assistant"][:3]
    assert len(notes) == 3 and all(n.startswith("[run failed: ") and "cut off" in n for n in notes)
    assert not any("tok1" in content for _, content in texts)


# -- 5. no starvation ---------------------------------------------------------------------------

P50_BOUND = 0.05 * 3  # the 50 ms, with slack for a loaded 2-core test machine


def _others_answer(d: Daemon, healthy: str) -> None:
    figures = {"health": p50(lambda: d.get("/api/health", timeout=5).raise_for_status()),
               "list": p50(lambda: d.get("/api/agents", timeout=5).raise_for_status()),
               "other agent": p50(lambda: d.post(f"/api/agents/{healthy}/message", json={"message": "hi"},
                                                 timeout=5).raise_for_status(), n=15)}
    assert max(figures.values()) < P50_BOUND, figures


@pytest.mark.slow
def test_one_stuck_agent_starves_nobody(slow, up) -> None:
    fault = f"hang-{uuid.uuid4().hex[:6]}"
    stuck, _ = spawn(slow, up, fault)
    healthy, _ = spawn(slow, up, "ok")
    pool = ThreadPoolExecutor(200)
    futures = [pool.submit(slow.post, f"/api/agents/{stuck}/message", json={"message": f"m{i}"}, timeout=60)
               for i in range(200)]
    refused = []
    deadline = time.monotonic() + 30
    while len(refused) < 200 - 1 - MAX_QUEUE and time.monotonic() < deadline:
        refused = [f.result() for f in futures if f.done()]
        time.sleep(0.05)
    assert len(refused) == 200 - 1 - MAX_QUEUE
    for r in refused:
        assert r.status_code == 429 and r.headers["Retry-After"] == "2"
        assert "busy" in r.json()["error"]
    assert len(up.wait_conns(fault, 1)) == 1  # only the running one reached the provider
    _others_answer(slow, healthy)
    assert threads(slow) < SLOW_THREADS + 150
    assert slow.delete(f"/api/agents/{stuck}").status_code == 200
    waited = [f.result(timeout=10) for f in futures if f.result(timeout=10) not in refused]
    # The kill cut them off: each is answered as a message to a gone agent.
    assert len(waited) == 1 + MAX_QUEUE and all(r.status_code == 404 for r in waited)
    pool.shutdown()


def _hang_fifty_agents(d: Daemon, up: Upstream) -> tuple[str, list[str], str, ThreadPoolExecutor, list]:
    """50 agents on a hanging provider, 4 messages each (1 + MAX_QUEUE), and a healthy agent;
    returns once the 50 first calls reached the provider."""
    fault = f"hang-{uuid.uuid4().hex[:6]}"
    agents = [spawn(d, up, fault)[0] for _ in range(50)]
    healthy, _ = spawn(d, up, "ok")
    pool = ThreadPoolExecutor(200)

    def send(i: int, a: str) -> Any:
        return pool.submit(d.post, f"/api/agents/{a}/message", json={"message": f"m{i}"}, timeout=60)

    # The first messages first: a later one sent at the same time could reach its agent
    # before the first had claimed it, and count as a message to an idle agent.
    futures = [send(0, a) for a in agents]
    up.wait_conns(fault, 50, timeout=30)
    futures += [send(i, a) for i in range(1, 1 + MAX_QUEUE) for a in agents]
    return fault, agents, healthy, pool, futures


@pytest.mark.slow
def test_many_stuck_agents_starve_nobody(slow, up) -> None:
    fault, agents, healthy, pool, futures = _hang_fifty_agents(slow, up)
    time.sleep(0.5)
    assert not any(f.done() for f in futures)  # all 200 are held
    _others_answer(slow, healthy)
    count = threads(slow)
    assert count < SLOW_THREADS + 50 + 60  # server threads + one run worker per busy agent + fixed helpers
    for a in agents:
        slow.delete(f"/api/agents/{a}")
    assert all(f.result(timeout=10).status_code == 404 for f in futures)
    assert len(up.by_fault(fault)) == 50
    pool.shutdown()


@pytest.mark.slow
def test_many_stuck_agents_starve_nobody_with_the_default_caps(tmp_path_factory, up) -> None:
    """The default 128 threads and max_streams 96 cannot hold 200 hung requests: the ones that
    would wait behind a hung run are refused (503) first, so a message to a healthy agent,
    whose run starts at once, still finds a slot (agentd/server/slots.py)."""
    d = _daemon(tmp_path_factory, f"[api]\n{RATE}\n[llm]\ntimeout_secs = 60\nstream_idle_secs = 30\n"
                                  f"\n[agents]\nmax_queue = {MAX_QUEUE}\n" + NO_REMEMBERING)
    try:
        _, agents, healthy, pool, futures = _hang_fifty_agents(d, up)
        deadline = time.monotonic() + 20
        while sum(f.done() for f in futures) < 200 - 72 and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = [f.result() for f in futures if f.done()]
        assert len(refused) == 200 - 72, "50 running and 22 waiting: 96 slots less the 24 kept back"
        assert all(r.status_code == 503 and r.headers["Retry-After"] == "1" for r in refused)
        _others_answer(d, healthy)
        for a in agents:
            d.delete(f"/api/agents/{a}")
        assert all(f.result(timeout=10).status_code in (404, 503) for f in futures)
        pool.shutdown()
    finally:
        d.stop()


# -- 6. client disconnects ------------------------------------------------------------------------

def test_clients_that_leave_before_their_run_starts_never_start_it(slow, up) -> None:
    fault = f"hang-{uuid.uuid4().hex[:6]}"
    agent_id, _ = spawn(slow, up, fault)
    running = sse_open(slow, agent_id, "first")
    up.wait_conns(fault, 1)
    gave_up = 0
    for i in range(MAX_QUEUE):
        try:
            requests.post(f"{slow.url}/api/agents/{agent_id}/message", json={"message": f"impatient {i}"},
                          timeout=0.5)
        except requests.ReadTimeout:
            gave_up += 1
    assert gave_up == MAX_QUEUE
    time.sleep(0.5)  # the disconnects are noticed (polled every 0.1 s)
    # The queue is empty again: a new request is accepted, not refused as busy.
    late = threading.Thread(target=lambda: slow.post(f"/api/agents/{agent_id}/message",
                                                    json={"message": "late"}, timeout=30))
    late.start()
    time.sleep(0.3)
    assert slow.post(f"/api/agents/{agent_id}/stop").json()["was_running"] is True
    running.close()
    up.wait_conns(fault, 2)  # "late" ran next; none of the impatient ones did
    time.sleep(0.5)
    assert slow.post(f"/api/agents/{agent_id}/stop").json()["was_running"] is True
    late.join(5)
    assert len(up.by_fault(fault)) == 2
    deadline = time.monotonic() + 3  # the stopped run saves its turn a moment after the 409
    while True:
        texts = [t for role, t in session_texts(slow, agent_id) if role == "user"]
        if texts == ["first", "late"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert texts == ["first", "late"]


# -- 7. upstream status reaches the client ---------------------------------------------------------

@pytest.mark.parametrize("code", [429, 503])
def test_upstream_429_and_503_keep_status_and_retry_after(fast, up, code) -> None:
    fault = f"status-{code}-1"
    before = len(up.by_fault(fault))
    agent_id, name = spawn(fast, up, fault)
    r = fast.post(f"/api/agents/{agent_id}/message", json={"message": "busy?"})
    assert r.status_code == code and r.headers["Retry-After"] == "1"
    assert f"HTTP {code}" in r.json()["error"]
    assert len(up.by_fault(fault)) - before == 2  # retried once after 1 s; a second wait would pass the deadline
    assert f"status={code}" in failure_line(fast, name)
    r = v1_open(fast, name, "busy?", stream=False)
    assert r.status_code == code and r.headers["Retry-After"] == "1"
    events = list(sse(sse_open(fast, agent_id, "busy?")))
    assert events[-1][1] == "error" and events[-1][2]["status"] == code and events[-1][2]["retry_after"] == 1


def test_reset_after_the_request_was_sent_is_reported_as_such(fast, up) -> None:
    before = len(up.by_fault("reset"))
    agent_id, name = spawn(fast, up, "reset")
    r = fast.post(f"/api/agents/{agent_id}/message", json={"message": "reset"})
    assert r.status_code == 502
    error = r.json()["error"]
    assert "connection reset" in error and "after the request was sent" in error and "cannot reach" not in error
    assert len(up.by_fault("reset")) - before == 1  # not retried: the provider may have received it
    assert "status=502" in failure_line(fast, name)


# -- the drivers on their own (fast, in-process) ------------------------------------------------

def _endpoint(up: Upstream, fault: str, kind: str, timeout: float = 2.0):
    from agentd.llm.types import ProviderEndpoint

    base = up.base(fault, anthropic=kind != "openai")
    return ProviderEndpoint(f"p-{kind}", kind, base, api_key="k", timeout=timeout, stream_idle=IDLE)


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
def test_driver_cut_stream_is_truncated_in_every_format(up, kind) -> None:
    from agentd.llm import drivers
    from agentd.llm.types import ChatRequest, LLMError, Message

    seen: list = []
    request = ChatRequest(model="m", messages=[Message("user", "hi")])
    with pytest.raises(LLMError) as err:
        drivers.complete(_endpoint(up, "cut", kind), request, on_event=seen.append, retries=3)
    assert err.value.kind == "truncated" and "cut off" in err.value.message
    assert "".join(e.text for e in seen) == "tok1 tok2 "  # delivered, then the error: not retried
    result = drivers.complete(_endpoint(up, "ok", kind), request, on_event=lambda e: None)
    assert result.text == "tok1 tok2 " and result.finish_reason == "stop"


def test_driver_gives_up_when_retry_after_passes_the_deadline(up) -> None:
    from agentd.llm import drivers
    from agentd.llm.types import ChatRequest, LLMError, Message

    fault = f"status-429-30-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    with pytest.raises(LLMError) as err:
        drivers.complete(_endpoint(up, fault, "openai"), ChatRequest(model="m", messages=[Message("user", "x")]),
                         retries=3)
    # Waiting 30 s cannot end before the 2 s deadline: the 429 is reported at once, with its Retry-After.
    assert err.value.kind == "rate_limit" and err.value.retry_after == 30
    assert time.monotonic() - started < 1 and len(up.by_fault(fault)) == 1
