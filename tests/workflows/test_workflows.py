"""Workflows end to end: the real daemon, agents on the fake LLM, run records, restarts.

The fake LLM answers `echo: <prompt>` unless a directive in the prompt says otherwise,
so each step's output shows exactly what the step was sent.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from conftest import LLM_ENV, llm_config
from support import Daemon, db_rows, make_home, run_cli, store_url_for, wait_until
from tests.agents.test_agents import spawn
from tests.memory.test_races import _together


def agent_name(d: Daemon, prefix: str = "wf") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    spawn(d, name)
    return name


def create(d: Daemon, steps: list[dict], name: str = "wf", **extra) -> str:
    r = d.post("/api/workflows", json={"name": name, "description": "test", "steps": steps, **extra})
    assert r.status_code == 201, r.text
    return r.json()["workflow_id"]


def run(d: Daemon, workflow_id: str, text: str = "hello") -> dict:
    r = d.post(f"/api/workflows/{workflow_id}/run", json={"input": text})
    assert r.status_code == 200, r.text
    return r.json()


def results(d: Daemon, run_id: str) -> list[dict]:
    r = d.get(f"/api/workflows/runs/{run_id}")
    assert r.status_code == 200, r.text
    return r.json()["step_results"]


# -- create, list, read, delete -----------------------------------------------------------

def test_create_list_detail_delete(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    a_id = d.get("/api/agents").json()
    a_id = next(x["id"] for x in a_id if x["name"] == a)
    wid = create(d, [{"name": "one", "agent_name": a, "prompt": "say {{input}}", "output_var": "first"},
                     {"name": "two", "agent": {"id": a_id}, "prompt": "{{first}} again"},
                     {"name": "three", "agent": {"name": a}}], name="crud")
    assert uuid.UUID(wid)
    item = next(w for w in d.get("/api/workflows").json() if w["id"] == wid)
    assert item["name"] == "crud" and item["description"] == "test" and item["steps"] == 3
    assert item["created_at"]
    full = d.get(f"/api/workflows/{wid}").json()
    assert [s["name"] for s in full["steps"]] == ["one", "two", "three"]
    assert full["steps"][0]["agent"] == {"name": a} and full["steps"][1]["agent"] == {"id": a_id}
    assert full["steps"][0]["timeout_secs"] == 120 and full["steps"][0]["error_mode"] == "fail"
    assert full["steps"][2]["prompt"] == "{{input}}" and full["steps"][0]["mode"] == "sequential"
    # The definition read back is a valid definition (round trip through PUT).
    r = d.put(f"/api/workflows/{wid}", json={"name": "crud2", "steps": full["steps"]})
    assert r.status_code == 200 and r.json() == {"status": "updated", "workflow_id": wid}
    assert d.get(f"/api/workflows/{wid}").json()["name"] == "crud2"
    r = d.delete(f"/api/workflows/{wid}")
    assert r.status_code == 200 and r.json()["status"] == "removed"
    assert d.get(f"/api/workflows/{wid}").status_code == 404
    assert all(w["id"] != wid for w in d.get("/api/workflows").json())


def test_unknown_workflow_is_404(agent_daemon) -> None:
    d = agent_daemon
    missing = str(uuid.uuid4())
    for method, path in (("GET", f"/api/workflows/{missing}"), ("DELETE", f"/api/workflows/{missing}"),
                         ("POST", f"/api/workflows/{missing}/run"), ("GET", f"/api/workflows/{missing}/runs"),
                         ("GET", f"/api/workflows/runs/{missing}")):
        r = d.request(method, path, json={"input": "x"} if method == "POST" else None)
        assert r.status_code == 404, (method, path, r.text)
        assert "not found" in r.json()["error"]
    assert d.get("/api/workflows/not-a-uuid").status_code == 400


BAD_STEPS = [
    ({"mode": "sideways"}, "step 1 ('s'): mode"),
    ({"error_mode": "ignore"}, "step 1 ('s'): error_mode"),
    ({"timeout_secs": 0}, "step 1 ('s'): timeout_secs"),
    ({"timeout_secs": "10"}, "step 1 ('s'): timeout_secs"),
    ({"error_mode": "retry", "max_retries": 0}, "step 1 ('s'): max_retries"),
    ({"error_mode": "retry", "max_retries": True}, "step 1 ('s'): max_retries"),
    ({"mode": "loop", "max_iterations": -1}, "step 1 ('s'): max_iterations"),
    ({"mode": "conditional"}, "step 1 ('s'): condition"),
    ({"mode": "loop"}, "step 1 ('s'): until"),
    ({"condition": "x"}, "step 1 ('s'): condition: only applies"),
    ({"prompt": "use {{later}}"}, "step 1 ('s'): prompt: '{{later}}' is used before"),
    ({"prompt": "broken {{input"}, "step 1 ('s'): prompt: unbalanced"),
    ({"prompt": "bad {{two words}}"}, "step 1 ('s'): prompt: malformed placeholder"),
    ({"prompt": "empty {{}}"}, "step 1 ('s'): prompt: malformed placeholder"),
    ({"output_var": "not a name"}, "step 1 ('s'): output_var"),
    ({"agent_name": "no-such-agent-xyz"}, "step 1 ('s'): agent: no agent with name 'no-such-agent-xyz'"),
    ({"agent_name": None, "agent": {"id": str(uuid.uuid4())}}, "step 1 ('s'): agent: no agent with id"),
    ({"agent_name": None}, "step 1 ('s'): agent: an agent reference is required"),
    ({"colour": "red"}, "step 1 ('s'): colour: unknown field"),
]


@pytest.mark.parametrize("change, fragment", BAD_STEPS)
def test_create_rejects_bad_steps(agent_daemon, change: dict, fragment: str) -> None:
    d = agent_daemon
    step = {"name": "s", "agent_name": agent_name(d, "bad"), **change}
    step = {k: v for k, v in step.items() if v is not None}
    r = d.post("/api/workflows", json={"name": "bad", "steps": [step]})
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"], r.json()["error"]


def test_create_rejects_bad_flow(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    cases = [
        ({"steps": []}, "steps"),
        ({"steps": "nope"}, "steps"),
        ({"name": "", "steps": [{"agent_name": a}]}, "name"),
        ({"steps": [{"agent_name": a, "mode": "collect"}]}, "step 1: mode: a collect step needs"),
        # A fan-out step cannot read a variable set by a branch running at the same time.
        ({"steps": [{"agent_name": a, "mode": "fan_out", "output_var": "x"},
                    {"name": "b", "agent_name": a, "mode": "fan_out", "prompt": "{{x}}"}]},
         "step 2 ('b'): prompt: '{{x}}' is set by a fan_out step running in parallel"),
        ({"steps": [{"agent_name": a, "prompt": "{{y}}"}, {"agent_name": a, "output_var": "y"}]},
         "step 1: prompt: '{{y}}' is used before"),
    ]
    for body, fragment in cases:
        r = d.post("/api/workflows", json={"name": "flow", **body})
        assert r.status_code == 400, (body, r.text)
        assert fragment in r.json()["error"], (fragment, r.json()["error"])
    assert d.post("/api/workflows", data="{", headers={"Content-Type": "application/json"}).status_code == 400


# -- semantics ------------------------------------------------------------------------------

def test_sequential_templates_and_variables(agent_daemon) -> None:
    d = agent_daemon
    a, b = agent_name(d), agent_name(d)
    wid = create(d, [{"name": "first", "agent_name": a, "prompt": "one {{input}}", "output_var": "v1"},
                     {"name": "second", "agent_name": b, "prompt": "two {{ input }}"},
                     {"name": "third", "agent_name": a, "prompt": "three [{{v1}}] [{{input}}]"}])
    body = run(d, wid, "start")
    assert body["status"] == "completed" and "error" not in body
    assert body["output"] == "echo: three [echo: one start] [echo: two echo: one start]"
    res = results(d, body["run_id"])
    assert [r["step_name"] for r in res] == ["first", "second", "third"]
    for r in res:
        assert uuid.UUID(r["agent_id"]) and r["agent_name"] in (a, b)
        assert r["input_tokens"] > 0 and r["output_tokens"] > 0 and r["duration_ms"] >= 0
        assert r["status"] == "completed"
    assert res[1]["agent_name"] == b and res[1]["output"] == "echo: two echo: one start"
    runs = d.get(f"/api/workflows/{wid}/runs").json()
    assert len(runs) == 1 and runs[0]["state"] == {"status": "completed"}
    assert runs[0]["steps_completed"] == 3 and runs[0]["workflow_name"] == "wf"
    assert runs[0]["started_at"] and runs[0]["completed_at"]


def test_fan_out_collect_in_step_order(agent_daemon) -> None:
    d = agent_daemon
    a, b, c = agent_name(d), agent_name(d), agent_name(d)
    wid = create(d, [
        # The first branch is the slowest: collect still lists outputs in step order.
        {"name": "A", "agent_name": a, "mode": "fan_out", "prompt": "[[slow:0.3]]alpha {{input}}", "output_var": "x"},
        {"name": "B", "agent_name": b, "mode": "fan_out", "prompt": "beta {{input}}"},
        {"name": "C", "agent_name": c, "mode": "fan_out", "prompt": "gamma {{input}}"},
        {"name": "join", "mode": "collect"},
        {"name": "after", "agent_name": a, "prompt": "{{x}} | {{input}}"},
    ])
    body = run(d, wid, "q")
    assert body["status"] == "completed", body
    res = results(d, body["run_id"])
    joined = res[3]["output"]
    assert joined.index("echo: alpha q") < joined.index("echo: beta q") < joined.index("echo: gamma q")
    assert "--- begin A ---" in joined and "--- end C ---" in joined
    assert body["output"] == f"echo: echo: alpha q | {joined}"


def test_two_collect_groups_only_join_their_own_fan_out(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    wid = create(d, [{"name": "f1", "agent_name": a, "mode": "fan_out", "prompt": "one"},
                     {"name": "c1", "mode": "collect"},
                     {"name": "f2", "agent_name": a, "mode": "fan_out", "prompt": "two"},
                     {"name": "c2", "mode": "collect"}])
    body = run(d, wid)
    assert "echo: two" in body["output"] and "echo: one" not in body["output"]


def test_conditional_runs_or_passes_input_through(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    wid = create(d, [{"name": "gen", "agent_name": a, "prompt": "[[reply:Verdict: APPROVED]]"},
                     {"name": "if-approved", "agent_name": a, "mode": "conditional", "condition": "approved",
                      "prompt": "publish {{input}}"},
                     {"name": "if-rejected", "agent_name": a, "mode": "conditional", "condition": "rejected",
                      "prompt": "rewrite {{input}}"}])
    body = run(d, wid)
    assert body["status"] == "completed"
    # The met condition ran; the unmet one was skipped and passed its input through.
    assert body["output"] == "echo: publish Verdict: APPROVED"
    res = results(d, body["run_id"])
    assert [r["status"] for r in res] == ["completed", "completed", "skipped"]
    assert res[2]["output"] == body["output"] and "not met" in res[2]["note"]


def test_conditional_first_step_tests_run_input(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    wid = create(d, [{"agent_name": a, "mode": "conditional", "condition": "URGENT", "prompt": "handle {{input}}"}])
    assert run(d, wid, "this is urgent")["output"] == "echo: handle this is urgent"
    assert run(d, wid, "routine")["output"] == "routine"


def test_loop_until_met(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    # Each iteration's output is fed back as {{input}}; the until text (any case) appears on pass 3.
    wid = create(d, [{"name": "grow", "agent_name": a, "mode": "loop", "prompt": "x {{input}}",
                      "until": "X ECHO: X ECHO: X", "max_iterations": 10}])
    body = run(d, wid, "")
    res = results(d, body["run_id"])
    assert [r["iteration"] for r in res] == [1, 2, 3]
    assert body["output"] == res[-1]["output"] == "echo: x echo: x echo: x"


def test_loop_that_never_meets_until_stops_at_max_iterations(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    wid = create(d, [{"name": "spin", "agent_name": a, "mode": "loop", "prompt": "[[reply:still going]]",
                      "until": "done", "max_iterations": 4},
                     {"name": "next", "agent_name": a, "prompt": "after {{input}}"}])
    body = run(d, wid)
    assert body["status"] == "completed"
    res = results(d, body["run_id"])
    assert [r["iteration"] for r in res[:4]] == [1, 2, 3, 4] and len(res) == 5
    assert "not met after 4" in res[3]["note"]
    assert body["output"] == "echo: after still going"


# -- faults -------------------------------------------------------------------------------------

def test_step_timeout_fails_the_run(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    wid = create(d, [{"name": "ok", "agent_name": a},
                     {"name": "sleepy", "agent_name": a, "prompt": "[[slow:2.5]]zzz", "timeout_secs": 1},
                     {"name": "never", "agent_name": a}])
    body = run(d, wid)
    assert body["status"] == "failed" and body["output"] == ""
    assert body["error"] == "step 2 ('sleepy') failed: timed out after 1s"
    res = results(d, body["run_id"])
    assert [r["status"] for r in res] == ["completed", "failed"]
    item = d.get(f"/api/workflows/{wid}/runs").json()[0]
    assert item["state"] == {"status": "failed"} and item["steps_completed"] == 1
    # The agent is usable again once the timed-out call was cancelled.
    assert run(d, create(d, [{"agent_name": a, "prompt": "again"}]))["output"] == "echo: again"


def test_timeout_with_skip_passes_input_on(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    wid = create(d, [{"name": "sleepy", "agent_name": a, "prompt": "[[slow:2.5]]zzz", "timeout_secs": 1,
                      "error_mode": "skip"},
                     {"name": "next", "agent_name": a, "prompt": "got {{input}}"}])
    body = run(d, wid, "original")
    assert body["status"] == "completed" and body["output"] == "echo: got original"
    res = results(d, body["run_id"])
    assert res[0]["status"] == "skipped" and "timed out after 1s" in res[0]["error"]


def _fan_out_with_failing_branch(d: Daemon, error_mode: str, prompt: str, **extra) -> dict:
    a, b = agent_name(d), agent_name(d)
    wid = create(d, [{"name": "good", "agent_name": a, "mode": "fan_out", "prompt": "fine {{input}}"},
                     {"name": "flaky", "agent_name": b, "mode": "fan_out", "prompt": prompt,
                      "error_mode": error_mode, **extra},
                     {"name": "join", "mode": "collect"}])
    return run(d, wid, "in")


def test_fan_out_branch_failure_with_fail(agent_daemon) -> None:
    # The failure waits 2 s, so the good branch has ended by then even on a loaded machine
    # (a failure while it still ran would cancel it, and it would be recorded `failed`).
    body = _fan_out_with_failing_branch(agent_daemon, "fail", "[[slow:2]][[fail:400]]boom")
    assert body["status"] == "failed"
    assert body["error"].startswith("step 2 ('flaky') failed: ")
    res = results(agent_daemon, body["run_id"])
    assert {r["step_name"]: r["status"] for r in res} == {"good": "completed", "flaky": "failed"}


def test_fan_out_branch_failure_with_skip(agent_daemon) -> None:
    body = _fan_out_with_failing_branch(agent_daemon, "skip", "[[fail:400]]boom")
    assert body["status"] == "completed"
    # The skipped branch contributes nothing to collect; its error is on its step result.
    assert "echo: fine in" in body["output"] and "flaky" not in body["output"]
    res = {r["step_name"]: r for r in results(agent_daemon, body["run_id"])}
    assert res["flaky"]["status"] == "skipped" and res["flaky"]["error"]


def test_fan_out_branch_failure_with_retry(agent_daemon) -> None:
    # Fails once (a 400 is not retried by the driver), then succeeds on the workflow's retry.
    text = f"[[fail:400 times=1]]flaky-{uuid.uuid4().hex[:6]}"
    body = _fan_out_with_failing_branch(agent_daemon, "retry", text, max_retries=2)
    assert body["status"] == "completed", body
    res = {r["step_name"]: r for r in results(agent_daemon, body["run_id"])}
    assert res["flaky"]["status"] == "completed" and res["flaky"]["attempts"] == 2
    assert res["flaky"]["output"].startswith("echo: flaky-")


def test_retry_gives_up_after_max_retries(agent_daemon) -> None:
    body = _fan_out_with_failing_branch(agent_daemon, "retry", "[[fail:400]]always", max_retries=1)
    assert body["status"] == "failed"
    assert "step 2 ('flaky') failed: failed after 2 attempts:" in body["error"]


def test_retries_back_off_doubling_with_jitter(agent_daemon, fake_llm) -> None:
    text = f"[[fail:400]]backoff-{uuid.uuid4().hex[:6]}"
    body = _fan_out_with_failing_branch(agent_daemon, "retry", text, max_retries=3)
    assert "failed after 4 attempts:" in body["error"]
    arrived = [r["time"] for r in fake_llm.requests if text in str(r["json"])]
    gaps = [later - earlier for earlier, later in zip(arrived, arrived[1:])]
    # 0.25 s doubling, each ±20 % (an attempt itself adds a little on a loaded machine).
    assert len(gaps) == 3 and all(0.8 * base <= gap <= 1.2 * base + 0.5
                                  for gap, base in zip(gaps, [0.25, 0.5, 1.0])), gaps


def test_provider_5xx_in_sequential_step(agent_daemon) -> None:
    d = agent_daemon
    wid = create(d, [{"name": "down", "agent_name": agent_name(d), "prompt": "[[fail:500]]x"}])
    body = run(d, wid)
    assert body["status"] == "failed" and body["error"].startswith("step 1 ('down') failed: ")
    assert "500" in body["error"] or "server" in body["error"].lower()


def test_agent_killed_after_create_fails_the_step_clearly(agent_daemon) -> None:
    d = agent_daemon
    name = agent_name(d)
    agent_id = next(a["id"] for a in d.get("/api/agents").json() if a["name"] == name)
    wid = create(d, [{"name": "gone", "agent_name": name}])
    wid_by_id = create(d, [{"name": "gone", "agent": {"id": agent_id}}])
    assert d.delete(f"/api/agents/{agent_id}").status_code == 200
    body = run(d, wid)
    assert body["status"] == "failed"
    assert body["error"] == f"step 1 ('gone') failed: agent '{name}' not found (killed, or never existed)"
    assert agent_id in run(d, wid_by_id)["error"]
    # Nothing is left running.
    assert d.get(f"/api/workflows/{wid}/runs").json()[0]["state"] == {"status": "failed"}


def test_agent_killed_mid_step(agent_daemon, fake_llm) -> None:
    d = agent_daemon
    name = agent_name(d)
    agent_id = next(a["id"] for a in d.get("/api/agents").json() if a["name"] == name)
    nonce = uuid.uuid4().hex  # the fake LLM is the session's: other tests' prompts are in its log
    wid = create(d, [{"name": "long", "agent_name": name, "prompt": f"[[slow:2]]{nonce}", "timeout_secs": 30,
                      "error_mode": "retry", "max_retries": 3}])
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(run(d, wid)))
    thread.start()
    # The step's model call has begun: the step is running, not about to look its agent up.
    wait_until(lambda: any(nonce in str(r["json"]) for r in fake_llm.requests), "the step's model call")
    # A workflow with a run in progress cannot be deleted.
    assert d.delete(f"/api/workflows/{wid}").status_code == 409
    assert d.delete(f"/api/agents/{agent_id}").status_code == 200
    thread.join(30)
    # Killed is final: no retries, and the error says what happened.
    assert box["status"] == "failed", box
    assert box["error"] == f"step 1 ('long') failed: agent '{name}' was killed while the step was running"
    assert results(d, box["run_id"])[0]["attempts"] == 1


def test_runs_are_listed_per_workflow(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    w1, w2 = create(d, [{"agent_name": a}], name="one"), create(d, [{"agent_name": a}], name="two")
    r1 = {run(d, w1)["run_id"] for _ in range(2)}
    r2 = {run(d, w2)["run_id"]}
    assert {r["id"] for r in d.get(f"/api/workflows/{w1}/runs").json()} == r1
    assert {r["id"] for r in d.get(f"/api/workflows/{w2}/runs").json()} == r2


def step_events(d: Daemon, run_id: str) -> list[tuple[str, object]]:
    """A run's event stream read to its end: (event name, data) pairs."""
    r = requests.get(f"{d.url}/api/workflows/runs/{run_id}/events", stream=True, timeout=60)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    names = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    data = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert len(names) == len(data), r.text
    assert ": keep-alive" not in r.text.splitlines(), "a keep-alive before 15 s of quiet"
    return list(zip(names, data))


def test_step_events_of_a_run(agent_daemon) -> None:
    d = agent_daemon
    a = agent_name(d)
    # The first step answers after 2.5 s (under the model call limit of 3 s): the stream is open before it ends.
    wid = create(d, [{"name": "first", "agent_name": a, "prompt": "[[slow:2.5]] one {{input}}"},
                     {"name": "second", "agent_name": a, "prompt": "[[slow:1]] two {{input}}"}])
    r = d.post(f"/api/workflows/{wid}/runs", json={"input": "go"})
    assert r.status_code == 202, r.text
    run_id = r.json()["run_id"]
    events = step_events(d, run_id)
    recorded = results(d, run_id)
    done = ("done", {"run_id": run_id, "status": "completed", "output": "echo: two echo: one go", "error": None,
                     "steps_completed": 2})
    assert events == [("step_started", {"step_index": 0, "step_name": "first"}), ("step_result", recorded[0]),
                      ("step_started", {"step_index": 1, "step_name": "second"}), ("step_result", recorded[1]), done]
    # A finished run answers its results and its end at once.
    assert step_events(d, run_id) == [("step_result", recorded[0]), ("step_result", recorded[1]), done]
    failed = run(d, create(d, [{"name": "bad", "agent_name": a, "prompt": "[[fail:400]]"}]))
    [(name, result), last] = step_events(d, failed["run_id"])
    assert (name, result["status"]) == ("step_result", "failed")
    assert last == ("done", {"run_id": failed["run_id"], "status": "failed", "output": "", "error": failed["error"],
                             "steps_completed": 0})
    assert d.get(f"/api/workflows/runs/{uuid.uuid4()}/events").status_code == 404


def test_twenty_parallel_runs_of_one_workflow(agent_daemon) -> None:
    d = agent_daemon
    a, b = agent_name(d), agent_name(d)
    wid = create(d, [{"name": "s1", "agent_name": a, "prompt": "p {{input}}"},
                     {"name": "f1", "agent_name": a, "mode": "fan_out"},
                     {"name": "f2", "agent_name": b, "mode": "fan_out"},
                     {"name": "c", "mode": "collect"}])
    bodies: list[dict] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            bodies.append(run(d, wid, f"input-{i}"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(bodies) == 20 and all(b["status"] == "completed" for b in bodies), bodies
    for b in bodies:
        i = b["output"].split("echo: p input-")[1].split()[0]
        assert b["output"].count(f"input-{i}") == 2  # each run saw only its own input
    runs = d.get(f"/api/workflows/{wid}/runs").json()
    assert len(runs) == 20 and all(r["state"] == {"status": "completed"} for r in runs)


def test_steps_are_metered_and_respect_quota(agent_daemon) -> None:
    d = agent_daemon
    name = agent_name(d)
    before = d.get("/api/usage").json()["total_input_tokens"]
    run(d, create(d, [{"agent_name": name, "prompt": "metered"}]))
    assert d.get("/api/usage").json()["total_input_tokens"] > before
    spent = {a["agent_name"]: a for a in d.get("/api/budget/agents").json()}
    assert spent[name]["input_tokens"] > 0
    limited = f"q-{uuid.uuid4().hex[:6]}"
    spawn(d, limited, extra="[capabilities]\nmax_llm_tokens_per_hour = 5")
    wid = create(d, [{"agent_name": limited, "prompt": "one"}, {"agent_name": limited, "prompt": "two"}])
    body = run(d, wid)
    assert body["status"] == "failed" and "quota exceeded" in body["error"]


def test_run_input_validation(agent_daemon) -> None:
    d = agent_daemon
    wid = create(d, [{"agent_name": agent_name(d)}])
    assert d.post(f"/api/workflows/{wid}/run", json={"input": 5}).status_code == 400
    assert d.post(f"/api/workflows/{wid}/run", json=["x"]).status_code == 400
    assert d.post(f"/api/workflows/{wid}/run", json={"input": "x" * 70000}).status_code == 413


# -- retention (in-process: 200 real runs through HTTP would only slow the suite) --------------

def test_retention_evicts_oldest_finished_never_running(tmp_path: Path) -> None:
    from agentd.store import open_store
    from agentd.workflows.definition import WorkflowDef
    from agentd.workflows.store import RUN_RETENTION, WorkflowStore

    assert RUN_RETENTION == 200
    db = WorkflowStore(open_store(tmp_path / "t.db", store_url_for(tmp_path)))
    wid = db.create(WorkflowDef("r", "", [{"name": "s"}]))
    workflow = db.get(wid)
    running = db.create_run(workflow, "oldest, still running")
    db.start_run(running)
    finished = []
    for i in range(RUN_RETENTION + 5):
        run_id = db.create_run(workflow, str(i))
        db.finish_run(run_id, "completed", "ok", None, [], 0)
        finished.append(run_id)
    assert db.run_count() == RUN_RETENTION
    kept = {r["id"] for r in db.runs(wid)}
    assert running in kept
    assert not kept & set(finished[:6]) and set(finished[6:]) <= kept
    # Restart recovery: the interrupted run is failed, with a clear error.
    assert db.fail_interrupted("interrupted") == 1
    assert db.run(running)["state"] == {"status": "failed"} and db.run(running)["error"] == "interrupted"


# -- restart mid-run -------------------------------------------------------------------------------

@pytest.mark.slow
def test_restart_mid_run_marks_run_failed(tmp_path: Path, fake_llm) -> None:
    home = make_home(tmp_path / "restart", llm_config(fake_llm))
    d = Daemon(home, env_extra=LLM_ENV).start()
    try:
        spawn(d, "sleeper")
        wid = create(d, [{"name": "first", "agent_name": "sleeper"},
                         {"name": "nap", "agent_name": "sleeper", "prompt": "[[slow:2.5]]zz", "timeout_secs": 30}])
        def start_run() -> None:
            try:
                d.post(f"/api/workflows/{wid}/run", json={"input": "x"}, timeout=30)
            except requests.RequestException:
                pass  # expected: the daemon is killed while the request waits

        threading.Thread(target=start_run, daemon=True).start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            runs = d.get(f"/api/workflows/{wid}/runs").json()
            if runs and runs[0]["steps_completed"] == 1:
                break
            time.sleep(0.05)
        assert runs and runs[0]["state"] == {"status": "running"}, runs
        d.kill()
        d = Daemon(home, port=d.port, env_extra=LLM_ENV).start()
        runs = d.get(f"/api/workflows/{wid}/runs").json()
        assert len(runs) == 1 and runs[0]["state"] == {"status": "failed"}
        detail = d.get(f"/api/workflows/runs/{runs[0]['id']}").json()
        assert "interrupted" in detail["error"] and "restarted" in detail["error"]
        assert [r["step_name"] for r in detail["step_results"]] == ["first"]
        assert detail["completed_at"]
        # The workflow survived the restart and runs again.
        assert run(d, wid)["status"] == "completed"
    finally:
        d.stop()


@pytest.mark.parametrize("step", [
    {"name": "nap", "prompt": "[[slow:20]] zz", "timeout_secs": 60},
    # A retry waiting out its backoff: the stop must end the wait, not the next attempt.
    {"name": "nap", "prompt": "[[fail:400]] zz", "error_mode": "retry", "max_retries": 9},
])
def test_a_graceful_stop_ends_a_run_saying_the_daemon_stops(tmp_path: Path, fake_llm, step: dict) -> None:
    # Model calls outlast a stop that a loaded machine is slow to deliver.
    config = llm_config(fake_llm).replace("timeout_secs = 3\n", "timeout_secs = 30\n")
    d = Daemon(make_home(tmp_path / "graceful", config), env_extra=LLM_ENV).start()
    try:
        spawn(d, "sleeper")
        nonce = uuid.uuid4().hex  # the fake LLM is the session's: other tests' prompts are in its log
        step = {**step, "prompt": step["prompt"].replace("zz", nonce)}
        wid = create(d, [{"name": "first", "agent_name": "sleeper"}, {**step, "agent_name": "sleeper"}])
        answers: list = []
        waiter = threading.Thread(target=lambda: answers.append(
            d.post(f"/api/workflows/{wid}/run", json={"input": "x"}, timeout=60)), daemon=True)
        waiter.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                nonce in str(r["json"]) for r in fake_llm.requests):
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        code = d.stop()
    waiter.join(30)
    assert code == 0 and answers, "the run's caller got its answer before the daemon left"
    body = answers[0].json()
    assert (answers[0].status_code, body["status"]) == (200, "failed")
    assert body["error"].startswith("step 2 ('nap') failed: ") and "the daemon is shutting down" in body["error"], body
    assert "cancelled (stopped or killed)" not in body["error"], "BUG: the step blamed its agent"


# -- CLI -------------------------------------------------------------------------------------------

def test_cli_create_list_run(agent_daemon, tmp_path: Path) -> None:
    d = agent_daemon
    a = agent_name(d)
    toml_file = tmp_path / "wf.toml"
    toml_file.write_text(f'name = "cli-flow"\ndescription = "from toml"\n\n[[steps]]\nname = "greet"\n'
                         f'agent_name = "{a}"\nprompt = "hi {{{{input}}}}"\n\n[[steps]]\nname = "shout"\n'
                         f'agent_name = "{a}"\n')
    r = run_cli(d.home, "workflow", "create", str(toml_file))
    assert r.returncode == 0, r.stderr
    wid = r.stdout.split()[-1]
    assert uuid.UUID(wid)
    json_file = tmp_path / "wf.json"
    json_file.write_text(json.dumps({"name": "cli-json", "steps": [{"agent_name": a}]}))
    assert run_cli(d.home, "workflow", "create", str(json_file)).returncode == 0
    listed = run_cli(d.home, "workflow", "list")
    assert listed.returncode == 0 and "cli-flow" in listed.stdout and "cli-json" in listed.stdout
    out = run_cli(d.home, "workflow", "run", wid, "--input", "there")
    assert out.returncode == 0, out.stderr
    assert "greet" in out.stdout and "shout" in out.stdout and "completed" in out.stdout
    assert "echo: echo: hi there" in out.stdout
    by_name = run_cli(d.home, "workflow", "run", "cli-json", "--input", "x", "--json")
    assert by_name.returncode == 0 and json.loads(by_name.stdout)["status"] == "completed"
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[[steps]]\nagent_name = "nobody-here"\n')
    r = run_cli(d.home, "workflow", "create", str(bad))
    assert r.returncode != 0 and "no agent with name 'nobody-here'" in r.stderr


def test_runs_racing_the_workflows_deletion(agent_daemon) -> None:
    d = agent_daemon
    name = agent_name(d)
    for round_ in range(8):
        wid = create(d, [{"name": "one", "agent_name": name, "prompt": "[[reply:done]] {{input}}"}], name=f"r{round_}")
        answers: list[tuple[str, int, dict]] = []

        def work(i: int, s: requests.Session) -> None:
            if i == 0:
                time.sleep(0.004 * (round_ % 4))  # a few runs start first in some rounds
                r = s.delete(f"{d.url}/api/workflows/{wid}")
                answers.append(("delete", r.status_code, r.json()))
                return
            for _ in range(3):
                r = (s.post(f"{d.url}/api/workflows/{wid}/run", json={"input": "x"}) if i % 2 else
                     s.post(f"{d.url}/api/workflows/{wid}/runs", json={"input": "x"}))
                answers.append(("run", r.status_code, r.json()))

        _together(6, work)
        gone = {"error": "workflow not found"}
        busy = [{"error": f"workflow has {n} run(s) in progress; delete it when they end"} for n in range(1, 16)]
        assert all(status in (200, 202) or (status == 404 and body == gone)
                   for what, status, body in answers if what == "run"), answers
        [(_, status, body)] = [a for a in answers if a[0] == "delete"]
        assert status == 200 or (status == 409 and body in busy), (status, body)
        if status == 200:
            assert d.get(f"/api/workflows/{wid}").status_code == 404
        else:
            wait_until(lambda: all(r["state"]["status"] in ("completed", "failed")
                                   for r in d.get(f"/api/workflows/{wid}/runs").json()), "the runs to end")
        assert db_rows(d.home, "SELECT COUNT(*) FROM workflow_runs WHERE workflow_id NOT IN "
                               "(SELECT id FROM workflows)") == [(0,)], \
            "BUG: a run started while its workflow was deleted outlives the workflow"


def test_updates_of_one_workflow_at_once_and_its_deletion(agent_daemon) -> None:
    d = agent_daemon
    name = agent_name(d)
    for round_ in range(4):
        wid = create(d, [{"name": "one", "agent_name": name, "prompt": "{{input}}"}], name=f"u{round_}")
        answers: list[tuple[str, int, dict]] = []

        def work(i: int, s: requests.Session) -> None:
            if i == 0 and round_ % 2:
                time.sleep(0.01)
                r = s.delete(f"{d.url}/api/workflows/{wid}")
                answers.append(("delete", r.status_code, r.json()))
                return
            for j in range(4):
                r = s.put(f"{d.url}/api/workflows/{wid}", json={
                    "name": f"u{round_}-{i}-{j}", "steps": [{"name": f"s{i}-{j}", "agent_name": name, "prompt": "{{input}}"}]})
                answers.append(("put", r.status_code, r.json()))

        _together(6, work)
        assert all(status == 200 or (what, status, body) == ("put", 404, {"error": "workflow not found"})
                   for what, status, body in answers), f"BUG: {answers}"
        if round_ % 2:
            assert d.get(f"/api/workflows/{wid}").status_code == 404
        else:
            stored = d.get(f"/api/workflows/{wid}").json()
            writer = stored["name"].removeprefix(f"u{round_}-")
            assert [s["name"] for s in stored["steps"]] == [f"s{writer}"], stored
