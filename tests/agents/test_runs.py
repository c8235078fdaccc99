"""Runs (agentd/agents/runs.py), in process, with exact values.

A real manager on a real store, the real loop and the fake LLM: the token quota at and
past its limit, the user turn with attachments, what a run hands the loop (system prompt,
sampling, limits, tools, the Observe note, approvals in Manual mode), how each failure
closes the turn, the run lock, stop/stop_all, the queue, and conversations in their own
sessions.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
import time
from pathlib import Path

import pytest
from pony import orm

from agentd.agents.handle import STOPPED_NOTE, RunOptions
from agentd.agents.loop import RunCancelled
from agentd.agents.run_checks import check_quota, recent_tokens
from agentd.agents.run_errors import AgentRunError
from agentd.errors import BadRequest, Conflict, NotFound, TooManyRequests
from agentd.llm.types import GenerationParams, ImagePart
from support import children_named, wait_until
from mgrsupport import (Env, Recorder, fake, llm_config, lone_store_only, manifest,  # noqa: F401 (fake: a fixture)
                        run, run_in_conversation, run_on_caller, submit)


@pytest.fixture()
def env(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, {**llm_config(fake), "tools": {"approval_timeout_secs": 1}})
    yield e
    e.close()


@pytest.fixture()
def mgr(env):
    return env.manager()


def session_of(env, session_id: str) -> list:
    with orm.db_session:
        rows = env.store.raw_rows("SELECT body FROM session_messages WHERE session = $s ORDER BY id",
                                  {"s": session_id})
    return [json.loads(body) for (body,) in rows]


# -- quota ------------------------------------------------------------------------------------------
def test_quota_at_and_past_the_limit(mgr) -> None:
    h = mgr.spawn(manifest("quota", "[capabilities]\nmax_llm_tokens_per_hour = 100\n"))
    now = time.monotonic()
    h.token_log.extend([(now - 3000, 60), (now - 10, 39)])
    check_quota(h)   # 99 of 100: allowed
    h.token_log.append((now - 5, 1))
    with pytest.raises(TooManyRequests) as err:
        mgr.runs.checks.precheck(h, "")
    assert err.value.message == ("message delivery failed: quota exceeded: 100 of 100 LLM tokens used in the "
                                 "last hour (max_llm_tokens_per_hour)")
    assert err.value.retry_after == 600, "retry when the oldest entry leaves the hour"
    h.token_log.appendleft((now - 3601, 500))   # older than an hour: dropped, not counted
    with pytest.raises(TooManyRequests) as err:
        check_quota(h)
    assert "100 of 100" in err.value.message and len(h.token_log) == 3
    h.token_log[0] = (time.monotonic() - 3599.5, 60)   # half a second left in the hour
    with pytest.raises(TooManyRequests) as err:
        check_quota(h)
    assert err.value.retry_after == 1


def test_quota_under_resources_and_none_without_limit(mgr) -> None:
    h = mgr.spawn(manifest("res", "[resources]\nmax_llm_tokens_per_hour = 5\n"))
    h.token_log.append((time.monotonic(), 5))
    with pytest.raises(TooManyRequests) as err:
        check_quota(h)
    assert "5 of 5" in err.value.message
    free = mgr.spawn(manifest("free"))
    free.token_log.append((time.monotonic(), 10**9))
    check_quota(free)


def test_the_quota_hour_ignores_wall_clock_steps(mgr, monkeypatch) -> None:
    h = mgr.spawn(manifest("stepped", "[capabilities]\nmax_llm_tokens_per_hour = 5\n"))
    h.token_log.append((time.monotonic(), 5))
    wall = time.time()
    monkeypatch.setattr(time, "time", lambda: wall + 7200)  # the clock set two hours forward
    with pytest.raises(TooManyRequests):
        check_quota(h)
    monkeypatch.setattr(time, "time", lambda: wall - 7200)  # and back
    with pytest.raises(TooManyRequests) as err:
        check_quota(h)
    assert err.value.retry_after == 3600


def test_runs_count_their_tokens_and_hit_the_quota(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("count", 'system_prompt = "sys"\n[capabilities]\nmax_llm_tokens_per_hour = 6\n'))
    run(mgr, h, "one two")
    # input: "sys" + "one two" = 3 words; output: "echo: one two" = 3 words
    assert [n for _, n in h.token_log] == [6]
    with pytest.raises(TooManyRequests):
        run(mgr, h, "again")
    preflight = Recorder()
    m2 = env.manager(preflight=preflight)
    g = m2.spawn(manifest("pre"))
    run(m2, g, "x")
    assert preflight.calls == [(g,)]


# -- the user turn ---------------------------------------------------------------------------------
def test_the_token_log_keeps_only_the_last_hour_and_nothing_without_a_quota(mgr) -> None:
    # Every call appends to the log: it must not grow forever.
    h = mgr.spawn(manifest("hourly", 'system_prompt = "sys"\n[capabilities]\nmax_llm_tokens_per_hour = 1000\n'))
    now = time.monotonic()
    h.token_log.extend([(now - 7200, 11), (now - 3601, 12), (now - 3500, 13)])
    run(mgr, h, "one two")
    # input "sys" + "one two", output "echo: one two": 3 + 3 words
    assert [n for _, n in h.token_log] == [13, 6], "entries older than an hour are dropped on append"
    run(mgr, h, "three")
    assert [n for _, n in h.token_log] == [13, 6, 9], "the second run sends the first turn again: 7 + 2 words"
    free = mgr.spawn(manifest("unlimited"))
    run(mgr, free, "x")
    assert len(free.token_log) == 0, "BUG: an agent without a quota keeps a token log nobody reads"


def test_a_token_used_an_hour_ago_no_longer_counts(mgr) -> None:
    h = mgr.spawn(manifest("exact-hour", "[capabilities]\nmax_llm_tokens_per_hour = 10\n"))
    h.token_log.extend([(1000.0, 1), (1000.5, 2), (1001.0, 4)])
    assert [n for _, n in recent_tokens(h, 4600.5)] == [4]
    assert list(h.token_log) == [(1001.0, 4)], "the entries that left the hour are dropped"


def test_attachments_in_the_user_turn(mgr) -> None:
    h = mgr.spawn(manifest("att"))
    txt = mgr.save_upload(h, "notes.md", "text/markdown", "über\n".encode())
    png = mgr.save_upload(h, "p.png", "image/png", b"\x89PNG")
    pdf = mgr.save_upload(h, "d.pdf", "application/pdf", b"%PDF-1")
    user, refs = mgr.runs.build_user_message(h, "look", [{"file_id": txt["file_id"]}, {"file_id": png["file_id"]},
                                                    {"file_id": pdf["file_id"]}])
    assert user.role == "user"
    assert user.content == ("look\n[attached file notes.md]\nüber\n"
                            "\n[attached file d.pdf (application/pdf, 6 bytes); its content cannot be shown to the model]")
    assert user.images == [ImagePart("image/png", base64.b64encode(b"\x89PNG").decode())]
    assert refs == [{"file_id": png["file_id"], "filename": "p.png", "content_type": "image/png"}]
    extra = ImagePart("image/jpeg", "AAAA")
    user, refs = mgr.runs.build_user_message(h, "plain", [], [extra])
    assert (user.content, user.images, refs) == ("plain", [extra], [])
    with pytest.raises(BadRequest) as err:
        mgr.runs.build_user_message(h, "x", [{}])
    assert err.value.message == "invalid file id: '' is not a UUID"


def test_images_need_a_vision_model(mgr) -> None:
    h = mgr.spawn(manifest("blind", provider="deepseek", model="deepseek-chat"))
    img = ImagePart("image/png", "AAAA")
    with pytest.raises(BadRequest) as err:
        mgr.runs.build_user_message(h, "x", [], [img])
    assert err.value.message == ("model deepseek-chat does not support images; use a vision-capable model "
                                 "or send text only")
    mgr.runs.build_user_message(h, "text only", [])
    custom = mgr.spawn(manifest("own", 'base_url = "http://h/v1"\n', provider="mine", model="unknown-model"))
    assert mgr.runs.build_user_message(custom, "x", [], [img])[0].images == [img]


def test_a_run_stores_image_references_on_its_user_turn(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("pic"))
    png = mgr.save_upload(h, "p.png", "image/png", b"\x89PNG")
    result = run(mgr, h, "[[echo_params]]", attachments=[{"file_id": png["file_id"]}])
    assert json.loads(result.response)["n_images"] == 1
    assert session_of(env, h.session_id)[0] == {
        "role": "user", "content": "[[echo_params]]",
        "images": [{"file_id": png["file_id"], "filename": "p.png", "content_type": "image/png"}]}


# -- what a run hands the loop ---------------------------------------------------------------------
def params_of(mgr, h, options=None) -> dict:
    return json.loads(run(mgr, h, "[[echo_params]]", options=options).response)


def test_system_prompt_sampling_and_limits(mgr, fake) -> None:
    h = mgr.spawn(manifest("p", 'system_prompt = "Be exact."\nmax_tokens = 321\ntemperature = 1.5\n'))
    got = params_of(mgr, h)
    assert (got["system"], got["max_tokens"], got["temperature"], got["model"]) == ("Be exact.", 321, 1.5, "gpt-4o")
    assert got["n_tools"] == 39  # every ungated tool, the six scheduling tools included
    got = params_of(mgr, h, RunOptions(max_tokens=77, temperature=0.0, extra_system="Also this."))
    assert (got["system"], got["max_tokens"], got["temperature"]) == ("Be exact.\n\nAlso this.", 77, 0.0), \
        "BUG: temperature 0 from the request was replaced by the manifest's"
    got = params_of(mgr, h, RunOptions(params=GenerationParams(top_p=0.5)))
    assert got["max_tokens"] == 321 and fake.requests[-1]["json"]["top_p"] == 0.5, \
        "BUG: the request's sampling parameters did not reach the model"


def test_the_agents_permitted_skills_are_listed_in_its_system_prompt_when_it_can_read_them(env, tmp_path) -> None:
    from agentd.skills import Skills

    for name in ("alpha", "beta"):
        (tmp_path / "skills" / name).mkdir(parents=True)
        (tmp_path / "skills" / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name} skill\n---\n"
                                                             f"Do {name}.\n")
    mgr = env.manager(skills=Skills(tmp_path / "skills"))

    def agent(name: str, tools: str):
        return mgr.spawn(f'name = "{name}"\nskills = ["beta"]\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
                         f'system_prompt = "S"\n[capabilities]\ntools = {tools}\n')

    reader = agent("reader", '["skill_describe"]')
    assert json.loads(run(mgr, reader, "[[echo_params]]").response)["system"] == \
        "S\n\nSkills you can use (read one's instructions with skill_describe before following it):\n" \
        "- beta: The beta skill"
    assert run(mgr, reader, '[[tool:skill_describe {"name": "beta"}]]').response == \
        "tool said: # beta\nThe beta skill\n\nDo beta."
    other = agent("no-reader", '["system_time"]')
    assert json.loads(run(mgr, other, "[[echo_params]]").response)["system"] == "S", \
        "skills are not offered to an agent that cannot read them"


def test_a_runs_own_model_and_source_are_used_for_that_run_only(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("override"))
    calls = len(env.usage.calls)
    assert run(mgr, h, "[[reply:by cron]]", options=RunOptions(model="gpt4-mini", source="cron")).response == "by cron"
    assert fake.requests[-1]["json"]["model"] == "gpt-4o-mini", "an alias is resolved to its model"
    assert [call[2] for call in env.usage.calls[calls:]] == ["gpt-4o-mini"], "the call is paid at its own model"
    run(mgr, h, "[[reply:by hand]]")
    assert fake.requests[-1]["json"]["model"] == "gpt-4o"
    with pytest.raises(AgentRunError):
        run(mgr, h, "[[fail:400]]", options=RunOptions(source="cron"))
    assert [(m["content"][:12], m.get("source")) for m in session_of(env, h.session_id)] == [
        ("[[reply:by c", "cron"), ("by cron", None), ("[[reply:by h", None), ("by hand", None),
        ("[[fail:400]]", "cron"), ("[run failed:", None)]


def test_iteration_limit_and_tool_timeout_come_from_the_manifest(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("iter", "[resources]\nmax_iterations = 2\n"))
    result = run(mgr, h, '[[tool:system_time {} x5]]')
    assert result.iterations == 2
    slow = mgr.spawn(manifest("tt", '[resources]\ntool_timeout_secs = 0.5\n[capabilities]\nshell = ["*"]\n'
                                    'tools = ["shell_exec"]\n'))
    started = time.monotonic()
    result = run(mgr, slow, '[[tool:shell_exec {"command": "sleep 3"}]]')
    assert time.monotonic() - started < 2.5
    assert "timed out" in result.response or "0.5" in result.response
    # The abandoned command runs on to its end; wait until the tool has reaped it, so no child
    # of this process outlives the test (mutmut's runner waits for any child and fails on
    # one it did not start).
    for _ in range(100):
        if not children_named("sleep"):
            break
        time.sleep(0.1)


def test_observe_mode_runs_with_read_only_tools_and_its_note(mgr) -> None:
    h = mgr.spawn(manifest("obs"))
    mgr.set_mode(h, "Observe")
    events: list = []
    got = json.loads(run(mgr, h, "[[echo_params]]", emit=events.append).response)
    assert got["n_tools"] == 16
    assert [e.data["detail"] for e in events if e.type == "phase" and e.data["phase"] == "streaming"] == \
        ["Observe mode: read-only tools"]
    mgr.set_mode(h, "Auto")
    events.clear()
    run(mgr, h, "x", emit=events.append)
    assert [e.data["detail"] for e in events if e.type == "phase" and e.data["phase"] == "streaming"] == [""]


def test_tools_run_in_the_agents_workspace(env, mgr) -> None:
    h = mgr.spawn(manifest("ws"))
    run(mgr, h, '[[tool:file_write {"path": "a.txt", "content": "hi"}]]')
    assert (env.config.workspaces_dir / "ws" / "a.txt").read_text() == "hi"


def test_manual_mode_asks_for_approval_and_emits_the_phase(env, mgr) -> None:
    h = mgr.spawn(manifest("manual"))
    mgr.set_mode(h, "Manual")
    events: list = []

    asked: list = []

    def approve_when_asked() -> None:
        for _ in range(100):
            pending = mgr.runs.approvals.pending()
            if pending:
                asked.append(pending[0])
                mgr.runs.approvals.approve(pending[0]["id"])
                return
            time.sleep(0.05)

    threading.Thread(target=approve_when_asked).start()
    result = run(mgr, h, '[[tool:file_write {"path": "b.txt", "content": "ok"}]]', emit=events.append)
    phases = [e.data for e in events if e.type == "phase" and e.data["phase"] == "awaiting_approval"
              and e.data["detail"] != "file_write"]
    assert (env.config.workspaces_dir / "manual" / "b.txt").read_text() == "ok"
    assert result.response.startswith("tool said: ")
    assert [(a["agent_id"], a["agent_name"], a["tool"], a["input"]) for a in asked] == \
        [(h.id, "manual", "file_write", {"path": "b.txt", "content": "ok"})], "BUG: the approval names the wrong call"
    # A chat platform's approval buttons are built from the event's approval_id.
    approval_id = asked[0]["id"]
    assert phases == [{"phase": "awaiting_approval", "approval_id": approval_id,
                       "detail": f"file_write (approval {approval_id})"}]
    # Nobody decides: the call is denied after approval_timeout_secs (1 s here), no event sink needed.
    started = time.monotonic()
    result = run(mgr, h, '[[tool:file_write {"path": "c.txt", "content": "no"}]]')
    assert 0.9 < time.monotonic() - started < 6 and not (env.config.workspaces_dir / "manual" / "c.txt").exists()


# -- results and failures --------------------------------------------------------------------------
def test_cost_of_a_run(env, mgr) -> None:
    costs = iter([0.1, 0.20000000006, None])
    env.usage.value = lambda *a: next(costs)
    h = mgr.spawn(manifest("cost"))
    result = run(mgr, h, '[[tool:system_time {}]]')
    assert result.cost_usd == 0.3000000001, "two calls, summed and rounded to 10 places"
    env.usage.value = lambda *a: None
    assert run(mgr, h, "x").cost_usd is None
    costs = iter([0.5, None])
    env.usage.value = lambda *a: next(costs)
    assert run(mgr, h, '[[tool:system_time {}]]').cost_usd is None, "BUG: a call of unknown price was left out"


def test_a_failed_model_call_closes_the_turn_and_maps_the_status(env, mgr, caplog) -> None:
    caplog.set_level(logging.INFO, logger="agentd.agents")
    h = mgr.spawn(manifest("fails"))
    with pytest.raises(AgentRunError) as err:
        run(mgr, h, "[[fail:429 retry_after=4]]")
    exc = err.value
    assert exc.message.startswith("message delivery failed: ") and (exc.status, exc.kind, exc.retry_after) == \
        (429, "rate_limit", 4)
    stored = session_of(env, h.session_id)
    assert stored[0] == {"role": "user", "content": "[[fail:429 retry_after=4]]"}
    assert stored[1]["role"] == "assistant" and stored[1]["content"] == \
        "[run failed: " + exc.message.removeprefix("message delivery failed: ") + "]"
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run failed:")]
    assert len(line) == 1 and line[0].startswith(
        f"run failed: agent=fails provider=openai model=gpt-4o status=429 cause={exc.message} duration=")
    assert 0 <= float(line[0].rsplit("duration=", 1)[1].rstrip("s")) < 60
    assert h.cancel is None and h.run_lock.acquire(blocking=False)
    h.run_lock.release()


def test_the_loop_guard_ends_a_run_with_a_note(env, mgr) -> None:
    h = mgr.spawn(manifest("guard"))
    with pytest.raises(AgentRunError) as err:
        run(mgr, h, '[[tool:file_read {"path": "x"} x100]]')
    assert err.value.kind == "loop_guard" and err.value.status == 500
    assert err.value.message.startswith("message delivery failed: loop guard stopped the run: ")
    stored = session_of(env, h.session_id)
    assert stored[-1] == {"role": "assistant",
                          "content": "[run failed: " + err.value.message.removeprefix("message delivery failed: ") + "]"}


def test_a_cancelled_run_is_closed_with_the_stopped_note(env, mgr, caplog) -> None:
    caplog.set_level(logging.INFO, logger="agentd.agents")
    h = mgr.spawn(manifest("stopme"))
    threading.Timer(0.3, lambda: mgr.stop(h)).start()
    with pytest.raises(RunCancelled):
        run(mgr, h, "[[slow:5]]")
    assert session_of(env, h.session_id) == [{"role": "user", "content": "[[slow:5]]"},
                                             {"role": "assistant", "content": STOPPED_NOTE}]
    stopped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run stopped: ")]
    assert len(stopped) == 1 and stopped[0].startswith("run stopped: agent=stopme provider=openai model=gpt-4o duration=")
    assert 0.2 <= float(stopped[0].rsplit("duration=", 1)[1].rstrip("s")) < 60
    assert mgr.stop(h) is False, "nothing runs any more"


def test_a_run_of_a_killed_agent_or_with_cancel_set_does_not_start(mgr, fake) -> None:
    h = mgr.spawn(manifest("pre-cancel"))
    cancel = threading.Event()
    cancel.set()
    before = len(fake.requests)
    with pytest.raises(RunCancelled):
        run(mgr, h, "x", cancel=cancel)
    g = mgr.spawn(manifest("dead"))
    g.killed = True
    with pytest.raises(RunCancelled):
        run(mgr, g, "x")
    assert len(fake.requests) == before


def test_a_busy_agent(mgr) -> None:
    h = mgr.spawn(manifest("busy"))
    h.run_lock.acquire()
    try:
        started = time.monotonic()
        with pytest.raises(Conflict) as err:
            run(mgr, h, "x", lock_timeout=0.2)
        assert err.value.message == "agent busy is busy with another run" and time.monotonic() - started >= 0.19
    finally:
        h.run_lock.release()
    done: list = []
    h.run_lock.acquire()
    t = threading.Thread(target=lambda: done.append(run(mgr, h, "waited").response))
    t.start()
    time.sleep(1.3)  # (past one second: "no timeout" is not a short one)
    assert done == [], "without a lock timeout a run waits for the agent"
    h.run_lock.release()
    t.join(10)
    assert done == ["echo: waited"]


def test_other_failures_still_write_usage(env) -> None:
    written: list = []
    mgr = env.manager(write_usage=lambda tx, rows: written.extend(rows))

    def record(handle, provider, model, response, usage=None):
        usage.append({"model": model})
        raise RuntimeError("metering broke")

    env.usage.value = record
    h = mgr.spawn(manifest("boom"))
    with caplog_at_warning() as records:
        with pytest.raises(RuntimeError):
            run(mgr, h, "x")
    assert written == [{"model": "gpt-4o", "key_id": None}]
    line = [r.getMessage() for r in records if r.getMessage().startswith("run failed:")]
    assert len(line) == 1 and line[0].startswith(
        "run failed: agent=boom provider=openai model=gpt-4o status=500 cause=RuntimeError: metering broke duration=")
    assert 0 <= float(line[0].rsplit("duration=", 1)[1].rstrip("s")) < 60


def test_a_failed_run_is_published_as_agent_failed_and_a_stopped_one_is_not(env) -> None:
    from agentd.agents.cooperation import Cooperation
    from agentd.triggers.bus import EventBus

    bus = EventBus()
    heard: list = []
    bus.subscribe(heard.append)
    mgr = env.manager(cooperation=Cooperation(None, bus))
    h = mgr.spawn(manifest("falls-over"))
    try:
        with pytest.raises(AgentRunError) as err:
            run(mgr, h, "[[fail:400]]", origin="trigger")
        wait_until(lambda: len(heard) == 1, "the agent_failed event")
        [event] = heard
        assert (event.kind, event.type, event.agent_id, event.origin, event.key_id) == \
            ("agent", "agent_failed", h.id, "trigger", "")
        assert event.payload == {"agent_id": h.id, "agent_name": "falls-over", "error": err.value.message,
                                 "run_origin": "trigger"}

        def record(handle, provider, model, response, usage=None):
            raise RuntimeError("x" * 2000)

        env.usage.value = record
        with pytest.raises(RuntimeError):
            run(mgr, h, "y")
        wait_until(lambda: len(heard) == 2, "the second agent_failed event")
        assert heard[1].payload["error"] == "RuntimeError: " + "x" * 986, "the cause is cut at 1000 characters"
        assert (heard[1].origin, heard[1].payload["run_origin"]) == ("api", "api")
        env.usage.value = None
        stopped = threading.Event()
        stopped.set()
        with pytest.raises(RunCancelled):
            run(mgr, h, "x", cancel=stopped)
        with pytest.raises(AgentRunError) as err:
            run(mgr, h, "[[fail:400]]")
        wait_until(lambda: len(heard) == 3, "the third agent_failed event")
        assert heard[2].payload["error"] == err.value.message, "BUG: a stopped run was published as a failure"
    finally:
        bus.close()


def test_runs_are_counted_by_origin_and_outcome_and_a_full_queue_as_a_refusal(env, monkeypatch) -> None:
    from agentd.metrics import Metrics

    metrics = Metrics(agent_labels=True)
    mgr = env.manager(metrics=metrics)
    h = mgr.spawn(manifest("counted"))
    run(mgr, h, "ok", origin="trigger")
    with pytest.raises(AgentRunError):
        run(mgr, h, "[[fail:400]]")
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(RunCancelled):
        run(mgr, h, "x", cancel=stopped, origin="schedule")

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert [sample("agentd_runs_total", origin=origin, outcome=outcome, agent="counted") for origin, outcome in
            (("trigger", "completed"), ("api", "failed"), ("schedule", "cancelled"))] == [1.0, 1.0, 1.0]
    assert sample("agentd_run_duration_seconds_count", origin="trigger") == 1.0
    assert 0 < sample("agentd_run_duration_seconds_sum", origin="trigger") < 60
    monkeypatch.setattr(env.config.agents, "max_queue", 1)
    h.run_lock.acquire()
    try:
        running = submit(mgr, h, "first")
        wait_until(lambda: h.busy and not h.waiting, "the first run to leave the queue")
        queued = submit(mgr, h, "second")
        with pytest.raises(TooManyRequests) as err:
            submit(mgr, h, "third")
        assert err.value.message == ("agent counted is busy: 1 requests are already waiting for it (max_queue 1); "
                                     "try again later")
        assert sample("agentd_requests_refused_total", reason="queue_full", agent="counted") == 1.0
    finally:
        h.run_lock.release()
    assert [running.result(10).response, queued.result(10).response] == ["echo: first", "echo: second"]


def test_quota_and_budget_refusals_are_counted_by_reason_and_agent(env) -> None:
    from agentd.metrics import Metrics

    metrics = Metrics(agent_labels=True)
    broke = {"agent": False, "key": False}

    def budget(_handle) -> None:
        if broke["agent"]:
            raise TooManyRequests("budget exceeded", retry_after=60)

    def key_budget(_key_id: str) -> None:
        if broke["key"]:
            raise TooManyRequests("the key's budget is exceeded", retry_after=60)

    mgr = env.manager(metrics=metrics, preflight=budget, key_budget=key_budget)
    rationed = mgr.spawn(manifest("rationed", "[capabilities]\nmax_llm_tokens_per_hour = 1\n"))
    paying = mgr.spawn(manifest("paying"))
    run(mgr, rationed, "spend it")
    with pytest.raises(TooManyRequests):
        run(mgr, rationed, "once more")
    broke["agent"] = True
    with pytest.raises(TooManyRequests):
        run(mgr, paying, "hi")
    broke.update(agent=False, key=True)
    with pytest.raises(TooManyRequests):
        run(mgr, paying, "hi", key_id="k1")

    def refused(reason: str, agent: str) -> float | None:
        return metrics.registry.get_sample_value("agentd_requests_refused_total", {"reason": reason, "agent": agent})

    assert [refused("quota", "rationed"), refused("budget", "paying")] == [1.0, 2.0]
    assert [refused("budget", "rationed"), refused("quota", "paying")] == [None, None]


def test_a_run_on_a_worker_continues_the_trace_of_the_request_that_started_it(env) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentd import tracing
    from agentd.agents.run_request import INLINE, WORKER, RunRequest

    preflight = Recorder()
    mgr = env.manager(preflight=preflight)
    exporter = InMemorySpanExporter()
    assert tracing.configure(False, exporter=exporter)
    try:
        h = mgr.spawn(manifest("traced-worker"))
        with tracing.span("request") as request:
            ticket = mgr.runs.start(RunRequest(h, "hi", on=WORKER, origin="ws"))
        assert ticket.result().response == "echo: hi"
        assert len(preflight.calls) == 2, "a queued run is checked again when a worker takes it"
        assert mgr.runs.start(RunRequest(h, "now", on=INLINE)).result().response == "echo: now"
        assert len(preflight.calls) == 3, "a run that did not wait is checked once"
    finally:
        tracing.shutdown()
    run_span = [s for s in exporter.get_finished_spans() if s.name == "agent.run"][0]
    assert run_span.parent.span_id == request.get_span_context().span_id
    assert (run_span.attributes["agentd.agent"], run_span.attributes["agentd.run.origin"]) == ("traced-worker", "ws")


def test_a_runs_log_lines_name_its_request_and_agent_on_whichever_thread_runs_it(mgr) -> None:
    from agentd import logs
    from agentd.agents.run_request import WORKER, RunRequest

    seen: list = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append((record.getMessage().split(":")[0], logs.current()))
    logger = logging.getLogger("agentd.agents")
    logger.addHandler(handler)
    try:
        h = mgr.spawn(manifest("logged"))
        with pytest.raises(AgentRunError):
            run(mgr, h, "[[fail:400]]", request_id="req-1")
        assert logs.current() == logs.LogContext(), "the caller's context is given back"
        queued = mgr.runs.start(RunRequest(h, "[[fail:400]]", on=WORKER, request_id="req-2"))
        with pytest.raises(AgentRunError):
            queued.future.result(10)
    finally:
        logger.removeHandler(handler)
    assert [context for line, context in seen if line == "run failed"] == [
        logs.LogContext("req-1", "logged"), logs.LogContext("req-2", "logged")]


def test_a_database_outage_in_the_budget_check_is_the_outage_on_the_caller_and_on_the_worker(env, monkeypatch) -> None:
    # The budgets are read from a shared database: a run queued before the server went away
    # is checked again on its worker, outside the run's own handling of the outage.
    import sqlite3

    from agentd.agents.run_request import WORKER, RunRequest
    from agentd.store.outage import OUTAGE, StorageFull

    failing = threading.Event()
    caller = threading.current_thread()

    def preflight(_handle) -> None:
        if failing.is_set() or threading.current_thread() is not caller:
            raise sqlite3.OperationalError("database or disk is full")

    mgr = env.manager(preflight=preflight)
    h = mgr.spawn(manifest("budget-outage"))
    monkeypatch.setattr(OUTAGE, "since", None)
    try:
        ticket = mgr.runs.start(RunRequest(h, "queued", on=WORKER, origin="ws"))  # passes on the caller
        with pytest.raises(StorageFull) as on_worker:
            ticket.result()
        failing.set()
        with pytest.raises(StorageFull) as on_caller:
            mgr.runs.start(RunRequest(h, "refused", on=WORKER, origin="ws"))
    finally:
        OUTAGE.since = OUTAGE.error = None
    assert (on_worker.value.status, on_caller.value.status) == (507, 507)
    assert on_worker.value.message == \
        "insufficient storage: the disk holding the database is full; free some space and retry"


def test_a_database_outage_reading_a_queued_runs_attachment_is_the_outage(mgr, monkeypatch) -> None:
    import sqlite3

    from agentd.agents.run_request import WORKER, RunRequest
    from agentd.store.outage import OUTAGE, StorageFull

    h = mgr.spawn(manifest("attachment-outage"))
    upload = mgr.runs.uploads.save_upload(h, "note.txt", "text/plain", b"hello")

    def full(*_args, **_kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(mgr.runs.uploads, "read", full)  # the store fails under the run, not the run
    monkeypatch.setattr(OUTAGE, "since", None)
    try:
        ticket = mgr.runs.start(RunRequest(h, "read this", [{"file_id": upload["file_id"]}], on=WORKER, origin="ws"))
        with pytest.raises(StorageFull) as err:
            ticket.result()
    finally:
        OUTAGE.since = OUTAGE.error = None
    assert (err.value.status, err.value.message) == \
        (507, "insufficient storage: the disk holding the database is full; free some space and retry")


def test_a_database_outage_in_a_run_is_answered_as_the_outage_and_not_as_the_agents_failure(env, monkeypatch) -> None:
    import sqlite3

    from agentd.agents.cooperation import Cooperation
    from agentd.store.outage import OUTAGE, StorageFull
    from agentd.triggers.bus import EventBus

    def full(*_args, **_kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    bus, heard = EventBus(), []
    bus.subscribe(heard.append)
    mgr = env.manager(cooperation=Cooperation(None, bus))
    h = mgr.spawn(manifest("outage"))
    env.usage.value = full
    monkeypatch.setattr(OUTAGE, "since", None)
    try:
        with caplog_at_warning() as records:
            with pytest.raises(StorageFull) as err:
                run(mgr, h, "x")
        env.usage.value = None
        with pytest.raises(AgentRunError) as failed:
            run(mgr, h, "[[fail:400]]")
        # The bus delivers in order: had the outage been published, it would be heard first.
        wait_until(lambda: heard, "the agent_failed event")
        assert [e.payload["error"] for e in heard] == [failed.value.message], \
            "BUG: an outage was published as the agent's failure"
    finally:
        OUTAGE.since = OUTAGE.error = None
        bus.close()
    assert (err.value.status, err.value.message) == \
        (507, "insufficient storage: the disk holding the database is full; free some space and retry")
    assert [r.getMessage() for r in records if r.getMessage().startswith("run failed")] == [], \
        "the outage is logged once, not per run"


class caplog_at_warning:
    """The agentd.agents records logged inside the block."""

    def __enter__(self) -> list:
        self.records: list = []
        self.handler = logging.Handler()
        self.handler.emit = self.records.append
        self.logger = logging.getLogger("agentd.agents")
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self.handler)
        return self.records

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.level)


def test_memory_hooks(env) -> None:
    class Memory:
        def __init__(self) -> None:
            self.calls: list = []

        def context_for_run(self, agent_id, user_text, stored, system, owner=None):
            self.calls.append(("context", agent_id, user_text, list(stored), system, owner))
            calls = self.calls

            class Recall:
                def __call__(self) -> str:
                    return system + "\n\nRECALLED"

                def count_accesses(self, tx) -> None:
                    calls.append(("count",))
            return Recall()

        def after_exchange(self, *args, owner=None):
            self.calls.append(("after",) + args + (owner,))

    memory = Memory()
    mgr = env.manager(memory=memory)
    h = mgr.spawn(manifest("mem", 'system_prompt = "S"\n'))
    result = run(mgr, h, "[[echo_params]]", options=RunOptions(extra_system="X"))
    assert json.loads(result.response)["system"] == "S\n\nX\n\nRECALLED"
    assert memory.calls == [("context", h.id, "[[echo_params]]", [], "S\n\nX", ""), ("count",),
                                ("after", h.id, h.session_id, "[[echo_params]]", result.response, "")]


# -- stop, queue, conversations --------------------------------------------------------------------
def test_stop_cancels_approvals_and_the_run(mgr) -> None:
    h = mgr.spawn(manifest("st"))
    assert mgr.stop(h) is False
    waiting = mgr.runs.approvals.request(h.id, h.name, "file_write", {})
    other = mgr.runs.approvals.request("someone", "x", "file_write", {})
    cancel = threading.Event()
    h.cancel = cancel
    assert mgr.stop(h) is True and cancel.is_set()
    assert mgr.stop(h) is False, "already stopped"
    assert waiting.decision == "cancelled" and other.decision is None


@lone_store_only
def test_stop_on_a_cluster_asks_the_other_daemons(env) -> None:
    import dataclasses

    class Cluster:
        def __init__(self, n: int) -> None:
            self.n, self.asked = n, []

        def request_stop(self, agent_id: str) -> int:
            self.asked.append(agent_id)
            return self.n

    shared_store = dataclasses.replace(env.store, backend="postgres")
    lone = Cluster(1)
    m = env.manager(cluster=lone)
    h = m.spawn(manifest("cl"))
    assert m.stop(h) is False and lone.asked == [], "not shared: nobody else to ask"
    one = Cluster(1)
    assert env.manager(cluster=one, store=shared_store).stop(h) is True and one.asked == [h.id]
    none = Cluster(0)
    assert env.manager(cluster=none, store=shared_store).stop(h) is False and none.asked == [h.id]
    local = Cluster(1)
    m = env.manager(cluster=local, store=shared_store)
    cancel = threading.Event()
    h.cancel = cancel
    assert m.stop(h) is True and cancel.is_set() and local.asked == [], "a local run is stopped here"
    assert m.stop(h) is True and local.asked == [h.id], "set already: maybe another daemon runs it"


def test_a_cluster_runs_the_run(env) -> None:
    class Cluster:   # the interface of agentd.cluster.Cluster.run
        calls: list = []
        completed: list = []

        def run(self, handle, cancel, lock_timeout, body, *, completes=False, session_id="", key_id=""):
            self.calls.append((handle, cancel, lock_timeout, completes, session_id, key_id))
            return body(lambda tx, cost: self.completed.append(cost)) if completes else body()

    env.usage.value = 0.125
    mgr = env.manager(cluster=Cluster())
    h = mgr.spawn(manifest("leased"))
    cancel = threading.Event()
    assert run(mgr, h, "hi", lock_timeout=3.0, cancel=cancel).response == "echo: hi"
    assert Cluster.calls == [(h, cancel, 3.0, True, h.session_id, "")]  # the admin's run: no key pays
    assert Cluster.completed == [0.125], "the run record is closed with the run's cost"
    events: list = []
    png = mgr.save_upload(h, "c.png", "image/png", b"\x89PNG-c")
    run(mgr, h, "with a picture", [{"file_id": png["file_id"]}], emit=events.append)
    assert [e.data for e in events if e.type == "phase"][-1] == {"phase": "done", "detail": ""}, \
        "BUG: the cluster's run lost the event sink"
    assert session_of(env, h.session_id)[-2]["images"] == \
        [{"file_id": png["file_id"], "filename": "c.png", "content_type": "image/png"}]


def test_submit_wait_withdraw_and_stop_all(mgr) -> None:
    h = mgr.spawn(manifest("queued"))
    future = submit(mgr, h, "first")
    assert mgr.runs.queues.wait(future, threading.Event()).response == "echo: first"
    h.run_lock.acquire()
    try:
        running = submit(mgr, h, "[[slow:0.1]] runs")
        time.sleep(0.3)
        queued = submit(mgr, h, "waits")
        assert mgr.runs.queues.withdraw(queued) is True and mgr.runs.queues.withdraw(queued) is False
    finally:
        h.run_lock.release()
    assert mgr.runs.queues.wait(running, threading.Event()).response == "echo: runs"
    g = mgr.spawn(manifest("slowone"))
    a = submit(mgr, g, "[[slow:5]] a")
    time.sleep(0.3)
    b = submit(mgr, g, "b")
    mgr.stop_all()
    with pytest.raises(RunCancelled):
        a.result(5)
    with pytest.raises(RunCancelled):
        b.result(5)
    emitted: list = []
    c = submit(mgr, g, "c", emit=emitted.append, options=RunOptions(extra_system="E"))
    assert c.result(5).response == "echo: c" and emitted


def test_a_stop_reaches_a_run_that_started_but_has_not_taken_the_run_lock(env) -> None:
    # The queue has handed the run to a worker; its pre-checks (quota, budget) are still
    # going when the stop comes. CI's PostgreSQL pass once lost a shutdown in this window.
    entered, release = threading.Event(), threading.Event()
    caller = threading.current_thread()

    def preflight(_handle) -> None:
        if threading.current_thread() is caller:
            return  # the check when the run is started; the worker checks again
        entered.set()
        release.wait(5)

    m = env.manager(preflight=preflight)
    for how in ("submit", "stop_all"):
        entered.clear()
        release.clear()
        h = m.spawn(manifest(f"early-{how}"))
        future = submit(m, h, "[[slow:5]] late")
        assert entered.wait(5)
        if how == "submit":
            assert m.stop(h) is True
            assert m.stop(h) is False, "a second stop finds the run already stopping"
        else:
            m.stop_all()
        release.set()
        with pytest.raises(RunCancelled):
            future.result(4)
        assert h.starting is None and h.cancel is None
        assert submit(m, h, "after").result(5).response == "echo: after"


def test_tools_get_the_agents_id_its_operations_and_the_runs_cancel(env) -> None:
    written: list = []
    mgr = env.manager(write_usage=lambda tx, rows: written.extend(rows))
    h = mgr.spawn(manifest("ctxa", '[capabilities]\nshell = ["*"]\n'
                                   'tools = ["shell_exec", "memory_store", "agent_send"]\n'))
    other = mgr.spawn(manifest("ctxb"))
    assert run(mgr, h, '[[tool:memory_store {"key": "k", "value": "v"}]]').response.startswith("tool said: ")
    assert mgr.runs.kv.get(h.id, "k") == (True, "v") and mgr.runs.kv.get(other.id, "k")[0] is False, \
        "BUG: the tool stored under another agent's id"
    assert run(mgr, h, '[[tool:agent_send {"agent_id": "ctxa", "message": "hi"}]]').response == \
        "tool said: error: an agent cannot send a message to itself"
    assert run(mgr, h, '[[tool:agent_send {"agent_id": "ctxb", "message": "hi"}]]').response == \
        "tool said: echo: hi"
    # A stop reaches the running command through the tool's context, not only the loop;
    # the model call made before it is paid for (its usage row is written with the turn).
    env.usage.value = lambda handle, provider, model, response, usage=None: usage.append({"model": model})
    future = submit(mgr, h, '[[tool:shell_exec {"command": "sleep 30"}]]')
    for _ in range(100):
        if children_named("sleep"):
            break
        time.sleep(0.05)
    assert children_named("sleep"), "the command never started"
    assert mgr.stop(h) is True
    with pytest.raises(RunCancelled):
        future.result(10)
    for _ in range(100):
        if not children_named("sleep"):
            break
        time.sleep(0.05)
    assert not children_named("sleep"), "BUG: the stopped run's command runs on"
    assert written == [{"model": "gpt-4o", "key_id": None}], "BUG: a stopped run's usage was not written"


def test_media_tools_reach_the_agents_own_model_and_provider(tmp_path, fake, monkeypatch) -> None:
    from agentd.agents.tools.services import ToolServices
    from fakellm import TINY_PNG

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    monkeypatch.setenv("MEDIA_KEY", "sk-media")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    # The daemon's OpenAI URL leads nowhere: only the agent's own base_url reaches the provider.
    config = llm_config(fake)
    env = Env(tmp_path, {**config, "provider_urls": {**config["provider_urls"], "openai": dead}})
    try:
        audit = Recorder()
        mgr = env.manager(tool_services=ToolServices(env.config.tools, audit, Recorder(), Recorder()))
        tools = f'api_key_env = "MEDIA_KEY"\nbase_url = "{fake.openai_base}"\n' \
                '[capabilities]\ntools = ["media_describe", "speech_to_text"]\n'
        seeing = mgr.spawn(manifest("seeing", tools))
        unknown = mgr.spawn(manifest("unknown", tools, model="my-own-finetune"))
        claude = mgr.spawn(manifest("claude", '[capabilities]\ntools = ["media_describe", "speech_to_text"]\n',
                                    provider="anthropic", model="claude-sonnet-4-6"))
        proxied = mgr.spawn(manifest("proxied", tools, provider="my-proxy"))   # a provider the catalog does not know
        for h in (seeing, unknown, claude, proxied):
            workspace = env.config.workspaces_dir / h.name
            workspace.mkdir(parents=True)
            (workspace / "p.png").write_bytes(TINY_PNG)
            (workspace / "clip.wav").write_bytes(b"RIFF0000WAVE")
        asked = len(fake.requests)
        assert run(mgr, seeing, '[[tool:media_describe {"path": "p.png"}]]').response == \
            "tool said: echo: Describe this image."
        look = fake.requests[asked + 1]
        assert look["headers"]["authorization"] == "Bearer sk-media"
        assert look["json"] == {"model": "gpt-4o", "max_tokens": 1024, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe this image."},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(TINY_PNG).decode()}}]}]}
        asked = len(fake.requests)
        assert run(mgr, seeing, '[[tool:speech_to_text {"path": "clip.wav"}]]').response == \
            "tool said: transcript of clip.wav (12 bytes)"
        heard = fake.requests[asked + 1]
        assert (heard["path"], heard["headers"]["authorization"]) == ("/v1/audio/transcriptions", "Bearer sk-media")
        assert audit.calls == [
            ("tool.image_to_model", "seeing", {"agent_id": seeing.id, "bytes": len(TINY_PNG), "model": "gpt-4o"}),
            ("tool.speech_to_text", "seeing", {"agent_id": seeing.id, "file": "clip.wav", "bytes": 12,
                                               "provider": "openai"})]
        assert run(mgr, unknown, '[[tool:media_describe {"path": "p.png"}]]').response == \
            "tool said: error: model my-own-finetune is not in the catalog, so it is not known to accept images: " \
            "use a vision-capable model"
        assert run(mgr, claude, '[[tool:speech_to_text {"path": "clip.wav"}]]').response == \
            "tool said: error: speech-to-text is not available: provider anthropic has no OpenAI-compatible " \
            "/audio/transcriptions endpoint"
        assert run(mgr, proxied, '[[tool:speech_to_text {"path": "clip.wav"}]]').response == \
            "tool said: error: speech-to-text is not available: provider my-proxy has no OpenAI-compatible " \
            "/audio/transcriptions endpoint"
    finally:
        env.close()


def test_a_stop_ends_a_media_tools_model_call_at_once(tmp_path, fake, monkeypatch) -> None:
    from fakellm import TINY_PNG

    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    env = Env(tmp_path, llm_config(fake, timeout_secs=60))
    try:
        mgr = env.manager()
        h = mgr.spawn(manifest("looking", '[capabilities]\ntools = ["media_describe"]\n'))
        workspace = env.config.workspaces_dir / h.name
        workspace.mkdir(parents=True)
        (workspace / "p.png").write_bytes(TINY_PNG)
        asked = len(fake.requests)
        future = submit(mgr, h, '[[tool:media_describe {"path": "p.png", "prompt": "[[slow:60]] look"}]]')
        assert fake.wait_requests(asked + 2, 30), "the tool never asked the model"
        assert fake.requests[asked + 1]["json"]["messages"][0]["content"][0]["text"] == "[[slow:60]] look"
        assert mgr.stop(h) is True
        # Well before the model's answer or the call's own time limit (60 s each).
        with pytest.raises(RunCancelled):
            future.result(20)
    finally:
        env.close()


def test_tools_reach_the_daemons_memory_and_event_bus_in_the_name_of_the_runs_origin_and_key(env) -> None:
    from agentd.agents.cooperation import Cooperation
    from agentd.triggers.bus import EventBus

    class Memory(MemoryStandIn):
        def remember(self, agent_id, content, source, scope, metadata, confidence):
            self.remembered = (agent_id, content, source)
            return {"merged": False, "id": "m1"}

    memory, bus, heard = Memory(), EventBus(), []
    bus.subscribe(heard.append)
    mgr = env.manager(memory=memory, cooperation=Cooperation(None, bus))
    h = mgr.spawn(manifest("cooperates", '[capabilities]\ntools = ["memory_remember", "event_publish"]\n'))
    try:
        assert run(mgr, h, '[[tool:memory_remember {"content": "the sky is blue"}]]').response == \
            "tool said: remembered as memory m1"
        assert memory.remembered == (h.id, "the sky is blue", "inference")
        said = run(mgr, h, '[[tool:event_publish {"event_type": "ping", "payload": {"n": 1}}]]',
                   origin="trigger", key_id="k1").response
        wait_until(lambda: heard, "the published event")
        [event] = heard
        assert said == f"tool said: published event {event.id} (ping)"
        assert (event.kind, event.type, event.payload, event.agent_id, event.origin, event.key_id) == \
            ("custom", "ping", {"n": 1}, h.id, "trigger", "k1")
    finally:
        bus.close()


def test_tools_reach_the_daemons_cron_jobs_and_a2a_client_acting_as_the_runs_key(env) -> None:
    class Cron:
        def __init__(self) -> None:
            self.deleted: list = []

        def get(self, job_id):
            return {"id": job_id, "name": "nightly", "agent_id": h.id}

        def delete(self, job_id, by):
            self.deleted.append((job_id, by))

    class KeyRuns:
        def acting(self, key_id, scope=None):
            return f"principal of {key_id}"

    class A2A:
        def resolve(self, name):
            return f"http://{name}.example"

        def endpoint(self, url, get, check):
            return url + "/a2a", "1.0"

        def send(self, endpoint, message, context, post, check, version):
            return f"{endpoint} answered {message} in {version}"

    cron = Cron()
    mgr = env.manager(cron=cron, key_runs=KeyRuns(), a2a=A2A())
    h = mgr.spawn(manifest("reaches", '[capabilities]\nnetwork = ["*"]\n'
                                      'tools = ["schedule_delete", "a2a_send"]\n'))
    assert run(mgr, h, '[[tool:schedule_delete {"id": "j1"}]]', key_id="k1").response == \
        "tool said: removed scheduled task j1 (nightly)"
    assert cron.deleted == [("j1", "principal of k1")], "BUG: the job was changed by someone else than the run's key"
    assert run(mgr, h, '[[tool:a2a_send {"agent_name": "remote", "message": "hi"}]]').response == \
        "tool said: http://remote.example/a2a answered hi in 1.0"


def test_a_failed_run_keeps_the_user_turns_images(env, mgr) -> None:
    h = mgr.spawn(manifest("imgfail"))
    png = mgr.save_upload(h, "p.png", "image/png", b"\x89PNG-bytes")
    with pytest.raises(AgentRunError):
        run(mgr, h, "[[fail:400]]", [{"file_id": png["file_id"]}])
    stored = session_of(env, h.session_id)
    assert stored[0]["images"] == [{"file_id": png["file_id"], "filename": "p.png", "content_type": "image/png"}]
    assert stored[1]["content"].startswith("[run failed: ")


def test_the_run_failed_line_names_the_model_that_failed_last(mgr, caplog, monkeypatch) -> None:
    # The primary cannot be reached; its fallback times out, and a timeout ends the chain
    # with the fallback's own error: the line names the fallback, not the agent's model.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    monkeypatch.setattr(mgr.registry.config.llm, "timeout_secs", 0.5)
    caplog.set_level(logging.INFO, logger="agentd.agents")
    h = mgr.spawn(manifest("falls", f'base_url = "{dead}"\n'
                                    '[[fallback_models]]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n'))
    with pytest.raises(AgentRunError) as err:
        run(mgr, h, "[[slow:3]]")
    assert err.value.kind == "timeout" and "anthropic model claude-sonnet-4-6" in err.value.message
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("run failed:")]
    assert len(line) == 1 and line[0].startswith(
        f"run failed: agent=falls provider=anthropic model=claude-sonnet-4-6 status={err.value.status} "
        f"cause={err.value.message} duration="), line


def test_a_text_attachment_that_is_not_utf8_is_shown_with_replacement_marks(mgr) -> None:
    h = mgr.spawn(manifest("badtxt"))
    txt = mgr.save_upload(h, "bad.txt", "text/plain", b"ok \xff end")
    assert run(mgr, h, "read", [{"file_id": txt["file_id"]}]).response == \
        "echo: read\n[attached file bad.txt]\nok \ufffd end"


def test_images_in_the_options_and_submit_passes_everything_on(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("optimg"))
    image = ImagePart("image/png", base64.b64encode(b"\x89PNG-o").decode("ascii"))
    got = json.loads(run(mgr, h, "[[echo_params]]", options=RunOptions(images=[image])).response)
    assert got["n_images"] == 1, "BUG: the request's images did not reach the model"
    txt = mgr.save_upload(h, "s.txt", "text/plain", b"queued text")
    future = submit(mgr, h, "sub", [{"file_id": txt["file_id"]}], options=RunOptions(max_tokens=9))
    assert future.result(5).response == "echo: sub\n[attached file s.txt]\nqueued text"
    assert fake.requests[-1]["json"]["max_tokens"] == 9, "BUG: submit dropped the options"


def test_a_run_cancelled_before_it_starts(env, mgr) -> None:
    h = mgr.spawn(manifest("precancel"))
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(RunCancelled) as err:
        run(mgr, h, "never", cancel=cancel)
    assert err.value.message == "run cancelled"
    assert session_of(env, h.session_id) == [], "a run that never started leaves no turn"


class MemoryStandIn:
    """The two calls a run makes to the memory service, recorded; each model call's system
    prompt gets the number of the refresh that made it."""

    def __init__(self) -> None:
        self.asked: list = []
        self.exchanges: list = []
        self.owners: list = []
        self.refreshes = 0
        self.counted: list = []  # the transactions a run counted its recalls' accesses in

    def context_for_run(self, agent_id, user_text, window, system, owner=None):
        self.asked.append((agent_id, user_text, system))
        self.owners.append(owner)
        memory = self

        class Recall:
            def __call__(self) -> str:
                memory.refreshes += 1
                return f"{system} #{memory.refreshes}"

            def count_accesses(self, tx) -> None:
                memory.counted.append(tx)
        return Recall()

    def after_exchange(self, agent_id, session_id, user_text, answer, owner=None) -> None:
        self.exchanges.append((agent_id, session_id, user_text, answer))
        self.owners.append(owner)


def test_memory_is_asked_with_the_users_text_and_refreshed_before_each_model_call(env, fake) -> None:
    memory = MemoryStandIn()
    mgr = env.manager(memory=memory)
    h = mgr.spawn(manifest("mem", 'system_prompt = "S"\n'))
    result = run(mgr, h, "[[tool:system_time {}]]")
    systems = [r["json"]["messages"][0]["content"] for r in fake.requests[-2:]]
    assert systems == ["S #1", "S #2"], "BUG: the system prompt is not refreshed before each model call"
    assert memory.asked == [(h.id, "[[tool:system_time {}]]", "S")]
    assert memory.exchanges == [(h.id, h.session_id, "[[tool:system_time {}]]", result.response)]
    assert len(memory.counted) == 1 and memory.counted[0] is not None, "BUG: the recalls' accesses not counted"
    image = ImagePart("image/png", base64.b64encode(b"\x89PNG-m").decode("ascii"))
    run(mgr, h, "", options=RunOptions(images=[image]))
    assert memory.asked[-1][1] == "" and memory.exchanges[-1][2] == "", "an image-only message has no text"


def test_a_completed_run_writes_its_usage_rows(env) -> None:
    written: list = []
    mgr = env.manager(write_usage=lambda tx, rows: written.extend(rows))
    env.usage.value = lambda handle, provider, model, response, usage=None: usage.append({"model": model})
    h = mgr.spawn(manifest("paid"))
    run(mgr, h, "[[tool:system_time {}]]")
    assert written == [{"model": "gpt-4o", "key_id": None}] * 2, "BUG: a run's usage rows were not written"


def test_a_keys_run_is_checked_against_its_budget_and_its_rows_name_it(env) -> None:
    written: list = []
    asked: list = []

    def key_budget(key_id: str) -> None:
        asked.append(key_id)
        if key_id == "broke":
            raise TooManyRequests("over its budget", retry_after=30)

    mgr = env.manager(write_usage=lambda tx, rows: written.extend(rows), key_budget=key_budget)
    env.usage.value = lambda handle, provider, model, response, usage=None: usage.append({"model": model})
    h = mgr.spawn(manifest("keyed"))
    run(mgr, h, "hi", key_id="k1")
    run(mgr, h, "hi")
    assert written == [{"model": "gpt-4o", "key_id": "k1"}, {"model": "gpt-4o", "key_id": None}]
    with pytest.raises(TooManyRequests) as err:
        run(mgr, h, "hi", key_id="broke")
    assert err.value.retry_after == 30
    assert asked == ["k1", "broke"], "a key's budget is asked before each of its runs (and only its)"


def test_a_keys_queued_run_is_refused_when_its_budget_ran_out_while_it_waited(env) -> None:
    from agentd.agents.run_request import WORKER, RunRequest

    asked: list = []

    def key_budget(key_id: str) -> None:
        asked.append(key_id)
        if len(asked) > 1:
            raise TooManyRequests("over its budget", retry_after=30)

    mgr = env.manager(key_budget=key_budget)
    h = mgr.spawn(manifest("spent"))
    ticket = mgr.runs.start(RunRequest(h, "hi", on=WORKER, key_id="k1"))
    with pytest.raises(TooManyRequests) as err:
        ticket.future.result(10)
    assert (err.value.message, err.value.retry_after) == ("over its budget", 30)
    assert asked == ["k1", "k1"], "checked when started and again when a worker takes it"


def test_a_runs_owner_reaches_memory_unless_the_agent_shares(env) -> None:
    memory = MemoryStandIn()
    mgr = env.manager(memory=memory)
    private = mgr.spawn(manifest("owned"))
    shared = mgr.spawn(manifest("sharing", "[memory]\nshare_episodic = true\n"))
    run(mgr, private, "hi", owner="user:alice", session_id="11111111-1111-4111-8111-111111111111", label="user:alice")
    run(mgr, private, "hi")
    run(mgr, shared, "hi", owner="user:alice")
    assert memory.owners == ["user:alice", "user:alice", "", "", None, None]


def test_the_daemons_share_episodic_setting_is_the_default_a_manifest_overrides(tmp_path, fake, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    env = Env(tmp_path, {**llm_config(fake), "memory": {"share_episodic": True}})
    try:
        memory = MemoryStandIn()
        mgr = env.manager(memory=memory)
        shared = mgr.spawn(manifest("shares-by-default"))
        own = mgr.spawn(manifest("keeps-its-own", "[memory]\nshare_episodic = false\n"))
        run(mgr, shared, "hi", owner="user:bob")
        run(mgr, own, "hi", owner="user:bob")
        assert memory.owners == [None, None, "user:bob", "user:bob"]
    finally:
        env.close()


def test_run_now_on_a_busy_agent_and_wait_for_a_client_that_left(mgr) -> None:
    h = mgr.spawn(manifest("nowbusy"))
    first = submit(mgr, h, "[[slow:0.5]] first")
    time.sleep(0.1)
    assert h.busy
    assert run_on_caller(mgr, h, "second").response == "echo: second", "a busy agent's run_on_caller is queued"
    assert first.result(5).response == "echo: first"
    slow = submit(mgr, h, "[[slow:5]] long")
    with pytest.raises(RunCancelled):
        mgr.runs.queues.wait(slow, threading.Event(), disconnected=lambda: True)


def test_a_manual_approval_ends_with_the_runs_cancel(env, mgr) -> None:
    h = mgr.spawn(manifest("manualcancel", '[capabilities]\ntools = ["file_write"]\n'))
    mgr.set_mode(h, "Manual")
    mgr.registry.config.tools.approval_timeout_secs = 30
    future = submit(mgr, h, '[[tool:file_write {"path": "x.txt", "content": "x"}]]')
    for _ in range(100):
        if mgr.runs.approvals.pending():
            break
        time.sleep(0.05)
    assert mgr.runs.approvals.pending(), "no approval was asked for"
    mgr.runs.queues.withdraw(future)  # a started run: its cancel event is set
    with pytest.raises(RunCancelled):
        future.result(5)
    tool = [m for m in session_of(env, h.session_id) if m["role"] == "tool"]
    assert tool and tool[0]["content"].endswith("because the run was cancelled."), tool


def test_conversations_have_their_own_sessions(env, mgr, fake) -> None:
    import uuid

    h = mgr.spawn(manifest("conv"))
    run(mgr, h, "main")
    sid = str(uuid.uuid4())
    assert run_in_conversation(mgr, h, sid, "in the chat", label="tg:42").response == "echo: in the chat"
    assert [m["content"] for m in fake.requests[-1]["json"]["messages"] if m["role"] != "system"] == \
        ["in the chat"], "BUG: a new conversation was sent the agent's own session"
    assert run_in_conversation(mgr, h, sid, "again").response == "echo: again"
    assert [m["content"] for m in session_of(env, sid)] == ["in the chat", "echo: in the chat", "again", "echo: again"]
    assert [m["content"] for m in session_of(env, h.session_id)] == ["main", "echo: main"]
    with orm.db_session:
        row = env.store.e.SessionRow.get(id=sid)
        assert (row.label, row.agent.id) == ("tg:42", h.id)
    sid2 = str(uuid.uuid4())
    run_in_conversation(mgr, h, sid2, "no label")
    with orm.db_session:
        assert env.store.e.SessionRow.get(id=sid2).label is None
    assert h.session_tail[-1]["content"] == "echo: main", "BUG: a conversation changed the agent's own session cache"
    with h.run_lock:  # the agent's own session is busy: a conversation does not wait for it
        assert run_in_conversation(mgr, h, sid2, "meanwhile").response == "echo: meanwhile"
    assert h.cancel is None and len(session_of(env, h.session_id)) == 2
    gone = mgr.spawn(manifest("gone"))
    mgr.kill(gone)
    with pytest.raises(NotFound) as err:
        run_in_conversation(mgr, gone, str(uuid.uuid4()), "x")
    assert err.value.message == "agent not found"


def test_a_failed_run_in_a_conversation_closes_that_conversations_turn(env, mgr) -> None:
    import uuid

    h = mgr.spawn(manifest("convfail"))
    run(mgr, h, "main")
    sid = str(uuid.uuid4())
    with pytest.raises(AgentRunError) as err:
        run_in_conversation(mgr, h, sid, "[[fail:400]]", label="tg:9")
    note = "[run failed: " + err.value.message.removeprefix("message delivery failed: ") + "]"
    assert session_of(env, sid) == [{"role": "user", "content": "[[fail:400]]"}, {"role": "assistant", "content": note}]
    assert [m["content"] for m in session_of(env, h.session_id)] == ["main", "echo: main"], \
        "BUG: a conversation's failure was written into the agent's own session"


def test_a_conversations_run_for_a_worker_is_checked_once_and_does_not_wait_for_the_agent(env) -> None:
    import uuid

    from agentd.agents.run_request import WORKER, RunRequest

    preflight = Recorder()
    mgr = env.manager(preflight=preflight)
    h = mgr.spawn(manifest("chatty"))
    sid = str(uuid.uuid4())
    with h.run_lock:  # the agent's own session is busy
        ticket = mgr.runs.start(RunRequest(h, "hello", on=WORKER, session_id=sid, label="tg:7"))
        assert (ticket.here, ticket.result().response) == (False, "echo: hello")
    assert preflight.calls == [(h,)], "checked when started, not again on the worker"
    assert [m["content"] for m in session_of(env, sid)] == ["hello", "echo: hello"]


def test_run_now_runs_with_everything_it_was_given(env, mgr, fake) -> None:
    h = mgr.spawn(manifest("now"))
    txt = mgr.save_upload(h, "n.txt", "text/plain", b"inside")
    result = run_on_caller(mgr, h, "read", [{"file_id": txt["file_id"]}], RunOptions(max_tokens=7))
    assert result.response == "echo: read\n[attached file n.txt]\ninside"
    sent = fake.requests[-1]["json"]
    assert sent["max_tokens"] == 7, "BUG: run_on_caller dropped the request's options"
    assert sent["messages"][-1]["content"] == "read\n[attached file n.txt]\ninside", "BUG: attachments dropped"
    assert session_of(env, h.session_id)[-1] == {"role": "assistant", "content": "echo: read\n[attached file n.txt]\ninside"}
    assert run_on_caller(mgr, h, "plain").response == "echo: plain", "no attachments, options or cancel given"
    assert not h.busy


def test_run_now_honours_its_cancel_event_and_a_client_that_left(mgr) -> None:
    h = mgr.spawn(manifest("nowstop"))
    stop = threading.Event()
    stop.set()
    with pytest.raises(RunCancelled):
        run_on_caller(mgr, h, "never", cancel=stop)
    left = threading.Event()
    threading.Timer(0.3, left.set).start()
    with pytest.raises(RunCancelled):
        run_on_caller(mgr, h, "[[slow:5]] long", disconnected=left.is_set)
    assert not h.busy and run_on_caller(mgr, h, "again").response == "echo: again"


def test_a_conversations_run_on_the_callers_thread_stops_when_its_client_left(env, mgr) -> None:
    import uuid

    from agentd.agents.run_request import INLINE, RunRequest

    h = mgr.spawn(manifest("convleft"))
    sid = str(uuid.uuid4())
    left = threading.Event()
    # (Stopped, not ended by the model call's own time limit: 5 s here.)
    ticket = mgr.runs.start(RunRequest(h, "[[slow:30]] long", on=INLINE, session_id=sid))
    threading.Timer(0.3, left.set).start()
    with pytest.raises(RunCancelled):
        ticket.result(left.is_set)
    assert session_of(env, sid) == [{"role": "user", "content": "[[slow:30]] long"},
                                    {"role": "assistant", "content": STOPPED_NOTE}]


def test_a_conversations_run_on_a_worker_stops_when_its_client_left_or_it_is_stopped(env, mgr, fake) -> None:
    import uuid

    from agentd.agents.run_request import WORKER, RunRequest

    h = mgr.spawn(manifest("convworker"))
    for how in ("client left", "stopped"):
        sid, left = str(uuid.uuid4()), threading.Event()
        asked = len(fake.requests)
        ticket = mgr.runs.start(RunRequest(h, "[[slow:30]] long", on=WORKER, session_id=sid))
        assert ticket.here is False

        def stop() -> None:
            # Once its model call is under way (then not ended by that call's own time limit).
            wait_until(lambda: len(fake.requests) > asked, "the run's model call")
            if how == "client left":
                left.set()
            else:
                ticket.stop()

        stopper = threading.Thread(target=stop)
        stopper.start()
        with pytest.raises(RunCancelled):
            ticket.result(left.is_set)
        stopper.join(30)
        assert isinstance(ticket.future.exception(30), RunCancelled), how
        assert session_of(env, sid) == [{"role": "user", "content": "[[slow:30]] long"},
                                        {"role": "assistant", "content": STOPPED_NOTE}], how


# -- Runs.start: one entry for every run ------------------------------------------------------------
def test_start_refuses_a_clients_message_over_64_kb_before_anything_runs(env, fake) -> None:
    from agentd.agents.run_request import CALLER, INLINE, WORKER, RunRequest, check_message
    from agentd.errors import PayloadTooLarge

    preflight = Recorder()
    mgr = env.manager(preflight=preflight)
    h = mgr.spawn(manifest("big"))
    check_message("é" * (32 * 1024))  # 64 KB exactly (two bytes each): allowed
    asked = len(fake.requests)
    for on in (WORKER, CALLER, INLINE):
        with pytest.raises(PayloadTooLarge) as err:
            mgr.runs.start(RunRequest(h, "x" * (64 * 1024 + 1), on=on))
        assert err.value.message == "message too large (max 64 KB)"
    with pytest.raises(PayloadTooLarge) as err:
        check_message("y" * (64 * 1024 + 1), "input")
    assert err.value.message == "input too large (max 64 KB)"
    assert (preflight.calls, h.busy, len(h.waiting), len(fake.requests)) == ([], False, 0, asked), \
        "BUG: a refused message was checked further, queued or sent"
    # A prompt composed from earlier answers (workflow steps, agent sends) is not a client's.
    long = "z" * (64 * 1024 + 1)
    assert mgr.runs.start(RunRequest(h, long, on=INLINE, from_client=False)).result().response == f"echo: {long}"
    assert preflight.calls == [(h,)], "an inline run is checked once, when it is started"


def test_where_a_started_run_executes(env) -> None:
    from agentd.agents.run_request import CALLER, INLINE, WORKER, RunRequest

    mgr = env.manager()
    h = mgr.spawn(manifest("where"))
    ticket = mgr.runs.start(RunRequest(h, "here", on=CALLER))
    assert (ticket.here, ticket.future, h.busy) == (True, None, True), "an idle agent is held for the caller"
    assert ticket.result().response == "echo: here" and h.busy is False
    worker = mgr.runs.start(RunRequest(h, "worker", on=WORKER))
    assert worker.here is False and worker.future.result(10).response == "echo: worker"
    inline = mgr.runs.start(RunRequest(h, "inline", on=INLINE))
    assert (inline.here, h.busy) == (True, False), "an inline run takes no place in the queue"
    assert inline.result().response == "echo: inline"
    # stop(): a queued run is withdrawn and never runs; a running one is cancelled.
    h.run_lock.acquire()
    try:
        running = mgr.runs.start(RunRequest(h, "[[slow:5]] running", on=WORKER))
        time.sleep(0.2)
        queued = mgr.runs.start(RunRequest(h, "queued", on=WORKER))
        queued.stop()
        assert len(h.waiting) == 0 and queued.request.cancel.is_set()
        with pytest.raises(RunCancelled):
            queued.future.result(1)
        running.stop()
    finally:
        h.run_lock.release()
    with pytest.raises(RunCancelled):
        running.future.result(10)
    stopped = mgr.runs.start(RunRequest(h, "never", on=CALLER))
    stopped.stop()
    with pytest.raises(RunCancelled):
        stopped.result()
    # abandon(): a run held for a caller that will not wait frees the agent, never runs.
    held = mgr.runs.start(RunRequest(h, "never", on=CALLER))
    held.abandon()
    assert h.busy is False and [m["content"] for m in session_of(env, h.session_id)][-1] != "echo: never"


def test_a_run_queued_behind_the_agents_current_run_is_taken_out_by_stop_or_abandon(env, fake) -> None:
    from agentd.agents.run_request import CALLER, WORKER, RunRequest

    mgr = env.manager()
    h = mgr.spawn(manifest("queued"))
    asked = len(fake.requests)
    running = mgr.runs.start(RunRequest(h, "[[slow:30]] running", on=WORKER))
    try:
        wait_until(lambda: len(fake.requests) > asked, "the running run's model call")
        held = mgr.runs.start(RunRequest(h, "held", on=CALLER))
        assert (held.here, held.future is not None, len(h.waiting)) == (False, True, 1), \
            "a caller's run behind a busy agent waits for a worker"
        held.stop()
        assert len(h.waiting) == 0 and held.request.cancel.is_set()
        with pytest.raises(RunCancelled):
            held.future.result(1)
        queued = mgr.runs.start(RunRequest(h, "queued", on=WORKER))
        assert len(h.waiting) == 1
        queued.abandon()
        assert len(h.waiting) == 0 and queued.request.cancel.is_set()
        with pytest.raises(RunCancelled):
            queued.future.result(1)
    finally:
        running.stop()
    with pytest.raises(RunCancelled):
        running.future.result(30)
    assert [m["content"] for m in session_of(env, h.session_id)] == ["[[slow:30]] running", STOPPED_NOTE]

# Each place a run starts (message and /v1, SSE, WebSocket, channel, workflow step, agent_send,
# cron job, trigger, A2A, MCP): the architecture page lists the same.
STARTS = {"api/runs.py", "api/streaming.py", "api/sockets.py", "channels/inbound.py", "workflows/steps.py",
          "agents/ops.py", "schedules/scheduler.py", "triggers/service.py", "a2a/server.py", "mcp/server.py"}


def test_every_run_starts_through_runs_start_and_nothing_else_enters_a_run() -> None:
    """No module but the run path builds an agent loop or calls its inner steps, and every
    way a run starts calls `Runs.start`."""
    import re

    import agentd

    package = Path(agentd.__file__).parent
    bypass, starting = [], set()
    for path in package.rglob("*.py"):
        where = path.relative_to(package).as_posix()
        text = path.read_text(encoding="utf-8")
        if where not in ("agents/runs.py", "agents/run_request.py"):
            bypass += [f"{where}: {hit}" for hit in re.findall(r"AgentLoop\(|_run_locked\(|runs\._execute\(", text)]
        if re.search(r"\bruns\.start\((?:RunRequest\(|request\)|self\._request\()", text):
            starting.add(where)
    assert bypass == []
    assert starting == STARTS


def test_a_stop_naming_a_session_ends_that_sessions_runs_only(env, mgr, fake) -> None:
    import uuid

    from agentd.agents.run_request import WORKER, RunRequest

    h = mgr.spawn(manifest("sessionstop"))
    mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
    asked = len(fake.requests)
    tickets = {sid: mgr.runs.start(RunRequest(h, f"[[slow:2]] {sid}", on=WORKER, session_id=sid))
               for sid in (mine, theirs)}
    wait_until(lambda: len(fake.requests) >= asked + 2, "both runs' model calls")
    assert mgr.runs.stop(h, str(uuid.uuid4())) is False  # a session with no run going
    assert mgr.runs.stop(h) is False  # the agent's own session: idle
    assert mgr.runs.stop(h, mine) is True
    assert isinstance(tickets[mine].future.exception(30), RunCancelled)
    assert tickets[theirs].future.result(30).response == f"echo: {theirs}"
    assert mgr.runs.stop(h, mine) is False, "a stopped session's run is no longer counted as running"
    assert h.session_runs == {}, "a finished run leaves no cancel event behind"
