"""`log_format = "json"` through the real daemon: every line of its log is one JSON object
with the same keys, and the lines a run writes -- on the request's thread or on the
worker that runs a WebSocket's message -- carry the id of the request that asked for it."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import websocket

from agentd import logs
from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, wait_until

KEYS = ["time", "level", "logger", "message", "request_id", "agent", "run_id"]


def lines_of(d: Daemon) -> list[dict]:
    parsed = []
    for line in d.log().splitlines():
        if line.strip():
            record = json.loads(line)  # every line is JSON
            assert isinstance(record, dict) and list(record)[:7] == KEYS, record
            parsed.append(record)
    return parsed


def test_json_log_lines_carry_the_request_id_into_the_run(tmp_path: Path, fake_llm) -> None:
    config = 'log_level = "debug"\nlog_format = "json"\n' + llm_config(fake_llm)
    d = Daemon(make_home(tmp_path, config), env_extra=LLM_ENV).start()
    agent_id = d.post("/api/agents", json={"manifest_toml": 'name = "logged"\n'}).json()["agent_id"]
    failed = d.post(f"/api/agents/{agent_id}/message", json={"message": "[[fail:400]]"})
    assert failed.status_code >= 400
    request_id = failed.headers["X-Request-Id"]

    ws = websocket.create_connection(d.url.replace("http://", "ws://") + f"/api/agents/{agent_id}/ws", timeout=15)
    socket_request_id = ws.getheaders()["x-request-id"]
    assert json.loads(ws.recv())["type"] == "connected"
    ws.send(json.dumps({"type": "message", "content": "[[fail:401]] over the socket"}))
    while json.loads(ws.recv())["type"] not in ("error", "response"):
        pass
    ws.close()
    wait_until(lambda: len([r for r in lines_of(d) if r["message"].startswith("run failed")]) == 2,
               "the socket's run to log its failure")
    d.stop()

    records = lines_of(d)
    assert {r["level"] for r in records} >= {"INFO", "WARNING", "DEBUG"}
    run_lines = [r for r in records if r["request_id"] == request_id and r["agent"] == "logged"]
    messages = [r["message"] for r in run_lines]
    assert any(m.startswith("model call failed") for m in messages), messages
    # Inside the run its record's id is named too.
    assert all(len(r["run_id"] or "") == 36 for r in run_lines if r["message"].startswith("model call failed"))
    assert any(m.startswith("run failed: agent=logged") for m in messages), messages
    # Every line the run wrote names that request, and the agent.
    assert not [r for r in records if r["message"].startswith(("model call failed", "run failed"))
                and (r["request_id"] is None or r["agent"] != "logged")]
    # The socket's run ran on a worker thread and still names the upgrade request: the id its 101 answered.
    socket_run = [r for r in records if r["message"].startswith("run failed") and r["request_id"] != request_id]
    assert len(socket_run) == 1 and socket_run[0]["request_id"] == socket_request_id
    assert socket_run[0]["agent"] == "logged"
    # Its access line is written at the opening, with the status the wire said.
    opening = [r for r in records if r["logger"] == "agentd.http" and r["request_id"] == socket_request_id]
    assert len(opening) == 1 and f"/api/agents/{agent_id}/ws -> 101 (" in opening[0]["message"], opening
    assert records.index(opening[0]) < records.index(socket_run[0])
    # The request's own access line, written by the HTTP layer.
    access = [r for r in records if r["logger"] == "agentd.http" and r["request_id"] == request_id]
    assert len(access) == 1 and f"request {request_id}" in access[0]["message"]
    # Lines written for no request name none.
    start = next(r for r in records if r["logger"] == "agentd.daemon")
    assert (start["request_id"], start["agent"], start["run_id"]) == (None, None, None)


def test_a_record_names_the_bound_run_and_its_exception() -> None:
    formatter = logs.JsonFormatter()
    token = logs.bind(request_id="req-1", agent="a1")
    inner = logs.bind(run_id="run-1")
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record = logging.LogRecord("agentd.x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info())
    line = json.loads(formatter.format(record))
    logs.unbind(inner)
    after_run = json.loads(formatter.format(logging.LogRecord("agentd.x", logging.INFO, __file__, 1, "m", (), None)))
    logs.unbind(token)
    assert {k: line[k] for k in KEYS[1:]} == {"level": "ERROR", "logger": "agentd.x", "message": "failed here",
                                              "request_id": "req-1", "agent": "a1", "run_id": "run-1"}
    assert line["time"].endswith("Z") and "ValueError: boom" in line["exception"]
    assert (after_run["request_id"], after_run["agent"], after_run["run_id"]) == ("req-1", "a1", None)
    assert logs.current() == logs.LogContext()


def test_a_debug_log_holds_no_token_a_platform_puts_in_its_urls(tmp_path: Path) -> None:
    from channel_fixtures import configure, wait_active
    from fakes.telegram import FakeTelegram

    token = "123456:S3CRETTGAPIZQX4"
    fake = FakeTelegram(token).start()
    d = Daemon(make_home(tmp_path, 'log_level = "debug"\n'), env_extra={"TELEGRAM_BOT_TOKEN": token}).start()
    try:
        configure(d, "telegram", bot_token_env="TELEGRAM_BOT_TOKEN", api_url=fake.url, long_poll_secs=1)
        wait_active(d, "telegram")
        time.sleep(2.5)  # getMe and a long poll or two
        log = d.log()
        assert "DEBUG" in log and "telegram" in log and "S3CRETTGAPIZQX4" not in log
    finally:
        d.stop()
        fake.stop()
