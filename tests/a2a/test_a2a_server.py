"""The A2A JSON-RPC methods (agentd/a2a/server.py) over a real agent manager, in process.

The same service the daemon's /a2a routes call (tests/a2a/test_a2a.py drives them between two
daemons): request checks, which agent a message reaches, the task of a send (completed, failed,
refused), contexts as conversations, tasks/get and tasks/cancel with their errors, scoped keys,
the A2A 1.0 method names, and a stream's responses one by one.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from agentd.a2a import server
from agentd.a2a.server import A2AService
from agentd.a2a.wire import RpcError
from agentd.agents.events import Event
from agentd.principals import Principal
from mgrsupport import Env, fake, llm_config  # noqa: F401,F811 (fake: a fixture)

SCOPED = Principal(key_id="key-1", name="one", scopes=("agents",), agents=("alpha",))
OTHER = Principal(key_id="key-2", name="two", scopes=("agents",))


@pytest.fixture()
def mgr(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-a2a")
    env = Env(tmp_path, llm_config(fake))
    manager = env.manager()
    yield manager
    env.close()


def session_of(mgr, handle, context: str, caller: Principal | None = None) -> tuple[str, list | None]:
    """The label and message texts of the session an A2A context of `handle` is (None: no such session)."""
    import json

    from pony import orm

    key = f"{handle.id}:{caller.key_id}:{context}" if caller is not None else f"{handle.id}:{context}"
    session_id = str(uuid.uuid5(server._CONTEXTS, key))
    store = mgr.registry.store
    with orm.db_session:
        row = store.e.SessionRow.get(id=session_id)
        if row is None:
            return (f"a2a:{context}"[:200], None)
        texts = [json.loads(m.body).get("content") for m in row.items.order_by(lambda m: m.id)]
        return row.label, texts


def spawn(mgr, name: str):
    return mgr.spawn(f'name = "{name}"\ndescription = "agent {name}"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')


def user(text: str, **extra) -> dict:
    return {"kind": "message", "role": "user", "messageId": "m-1", "parts": [{"kind": "text", "text": text}], **extra}


def refused(fn, *args, **kw) -> tuple[int, str, object]:
    with pytest.raises(RpcError) as caught:
        fn(*args, **kw)
    return caught.value.code, caught.value.message, caught.value.data


def test_check_request() -> None:
    check = A2AService.check_request
    assert check({"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": "x"}}) == (
        7, "tasks/get", {"id": "x"})
    assert check({"jsonrpc": "2.0", "id": "s", "method": "m"}) == ("s", "m", {})
    bad = ("invalid JSON-RPC 2.0 request: it needs jsonrpc \"2.0\", a string method and a string or integer id")
    for payload in ({"jsonrpc": "1.0", "id": 1, "method": "m"}, {"id": 1, "method": "m"},
                    {"jsonrpc": "2.0", "id": 1, "method": 5}, {"jsonrpc": "2.0", "method": "m"},
                    {"jsonrpc": "2.0", "id": True, "method": "m"}, {"jsonrpc": "2.0", "id": 1.5, "method": "m"}):
        assert refused(check, payload) == (-32600, bad, None), payload
    assert refused(check, ["not", "an", "object"]) == (-32600, "the request must be one JSON-RPC 2.0 object", None)
    assert refused(check, {"jsonrpc": "2.0", "id": 1, "method": "m", "params": [1]}) == (
        -32602, "params must be an object", None)


def test_method_kinds_and_the_ones_not_offered(mgr) -> None:
    a2a = A2AService(mgr, mgr.runs)
    assert [a2a.is_stream(m) for m in ("message/stream", "SendStreamingMessage", "message/send")] == [True, True, False]
    assert [a2a.runs_a_message(m) for m in ("message/send", "SendMessage", "message/stream")] == [True, True, False]
    assert refused(a2a.call, "message/stream", {}, None) == (
        -32600, "message/stream answers a stream; it cannot be sent here", None)
    for method in ("tasks/pushNotificationConfig/set", "CreateTaskPushNotificationConfig"):
        assert refused(a2a.call, method, {}, None) == (-32003, "Push Notification is not supported", None)
    for method in ("tasks/resubscribe", "ListTasks", "GetExtendedAgentCard"):
        assert refused(a2a.call, method, {}, None) == (-32004, f"{method} is not supported by this agent", None)
    assert refused(a2a.call, "tasks/nothing", {}, None) == (-32601, "method not found: tasks/nothing", None)


def test_send_answers_a_completed_task(mgr) -> None:
    alpha = spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    task = a2a.call("message/send", {"message": user("hello")}, "alpha")
    context = task["contextId"]
    assert set(task) == {"kind", "id", "contextId", "status", "artifacts", "history", "metadata"}
    assert (task["kind"], task["metadata"]) == ("task", {"agent": "alpha"})
    uuid.UUID(task["id"]), uuid.UUID(context)
    sent, answer = task["history"]
    assert sent == {"kind": "message", "messageId": "m-1", "role": "user", "parts": [{"kind": "text", "text": "hello"}],
                    "contextId": context, "taskId": task["id"]}
    assert {k: answer[k] for k in ("kind", "role", "parts", "contextId", "taskId")} == {
        "kind": "message", "role": "agent", "parts": [{"kind": "text", "text": "echo: hello"}],
        "contextId": context, "taskId": task["id"]}
    assert task["status"]["state"] == "completed" and task["status"]["message"] == answer
    assert task["status"]["timestamp"].endswith("+00:00")
    [artifact] = task["artifacts"]
    assert artifact == {"artifactId": artifact["artifactId"], "name": "response",
                        "parts": [{"kind": "text", "text": "echo: hello"}]}
    assert str(uuid.UUID(artifact["artifactId"])) == artifact["artifactId"]
    assert a2a._cancels == {}, "a finished task keeps no cancel handle"
    # The conversation is a session of the agent's own, labelled with the context.
    assert session_of(mgr, alpha, context) == ("a2a:" + context, ["hello", "echo: hello"])
    assert a2a.call("tasks/get", {"id": task["id"]}, "alpha") == task
    assert refused(a2a.call, "tasks/cancel", {"id": task["id"]}, None) == (
        -32002, "Task cannot be canceled", {"id": task["id"]})


def test_a_message_without_messageid_gets_one_and_a_data_part_is_json(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    message = {"role": "user", "parts": [{"kind": "data", "data": {"n": 1}}]}
    task = a2a.call("message/send", {"message": message}, "alpha")
    uuid.UUID(task["history"][0]["messageId"])
    assert task["artifacts"][0]["parts"][0]["text"] == 'echo: {"n": 1}'


def test_which_agent_a_message_reaches(mgr) -> None:
    alpha = spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    # One agent: the daemon's endpoint needs no name.
    assert a2a.call("message/send", {"message": user("hi")}, None)["metadata"] == {"agent": "alpha"}
    beta = spawn(mgr, "beta")
    assert refused(a2a.call, "message/send", {"message": user("hi")}, None) == (
        -32602, "name the agent: params.metadata.agent, or send to the agent's own endpoint /a2a/agents/<name>", None)
    for key in server.AGENT_KEYS:
        for where in ("params", "message"):
            message = user("hi", metadata={key: "beta"}) if where == "message" else user("hi")
            params = {"message": message, **({"metadata": {key: beta.id}} if where == "params" else {})}
            assert a2a.call("message/send", params, None)["metadata"] == {"agent": "beta"}, (key, where)
    # params.metadata is looked at before the message's; an empty value names no agent.
    params = {"message": user("hi", metadata={"agent": "alpha"}), "metadata": {"agent": "", "agentId": "beta"}}
    assert a2a.call("message/send", params, None)["metadata"] == {"agent": "beta"}
    assert a2a.call("message/send", {"message": user("hi"), "metadata": "alpha"}, "alpha")["metadata"] == {
        "agent": "alpha"}
    assert refused(a2a.call, "message/send", {"message": user("hi")}, "gamma") == (
        -32602, "no agent named 'gamma'", None)
    assert refused(a2a.call, "message/send", {"message": user("hi"), "metadata": {"agent": "gamma"}}, None) == (
        -32602, "no agent named 'gamma'", None)
    assert refused(a2a.call, "message/send", {"message": user("hi"), "metadata": {"agent": 5}}, None) == (
        -32602, "no agent named 5", None)
    # The path names the agent by name only; the metadata by name or id.
    assert refused(a2a.call, "message/send", {"message": user("hi")}, alpha.id)[:2] == (
        -32602, f"no agent named {alpha.id!r}")
    # A scoped key sees only its agents: the others are as absent, and its one agent is "the only one".
    assert a2a.call("message/send", {"message": user("hi")}, None, caller=SCOPED)["metadata"] == {"agent": "alpha"}
    assert refused(a2a.call, "message/send", {"message": user("hi")}, "beta", caller=SCOPED) == (
        -32602, "no agent named 'beta'", None)


def test_context_ids(mgr) -> None:
    alpha = spawn(mgr, "alpha")
    spawn(mgr, "beta")
    a2a = A2AService(mgr, mgr.runs)
    first = a2a.call("message/send", {"message": user("one", contextId="ctx-1")}, "alpha")
    assert first["contextId"] == "ctx-1"
    # A follow-up naming the earlier task, which ended, is refused (A2A: its context goes on);
    # the same task for another agent, from another key, or a task never seen is not found,
    # and nothing runs.
    ended = f"task {first['id']} is completed: it takes no more messages; send to its contextId instead"
    assert refused(a2a.call, "message/send", {"message": user("two", taskId=first["id"])}, "alpha") == (
        -32004, ended, {"id": first["id"]})
    follow = a2a.call("message/send", {"message": user("two", contextId="ctx-1")}, "alpha")
    assert follow["contextId"] == "ctx-1" and follow["id"] != first["id"]
    for agent_name, caller, task_id in [("beta", None, first["id"]), ("alpha", SCOPED, first["id"]),
                                        ("alpha", None, "nope"), ("alpha", None, 5)]:
        kwargs = {"caller": caller} if caller else {}
        assert refused(a2a.call, "message/send", {"message": user("three", taskId=task_id)}, agent_name,
                       **kwargs) == (-32001, "Task not found", {"id": task_id}), (agent_name, task_id)
    assert refused(a2a.call, "message/send", {"message": user("three", taskId=first["id"], contextId="ctx-2")},
                   "alpha") == (-32602, f"message.contextId is not the context of task {first['id']}", None)
    own = a2a.call("message/send", {"message": user("one", contextId="s-ctx")}, "alpha", caller=SCOPED)
    assert refused(a2a.call, "message/send", {"message": user("two", taskId=own["id"])}, "alpha",
                   caller=SCOPED)[0] == -32004, "a key's own task is found"
    again = a2a.call("message/send", {"message": user("two", contextId="s-ctx")}, "alpha", caller=SCOPED)
    assert again["contextId"] == "s-ctx"
    for bad in ("", 5, "x" * 201):
        assert refused(a2a.call, "message/send", {"message": user("x", contextId=bad)}, "alpha") == (
            -32602, "message.contextId must be a non-empty string of at most 200 characters", None), bad
    assert a2a.call("message/send", {"message": user("x", contextId="c" * 200)}, "alpha")["contextId"] == "c" * 200
    # Each (agent, context) is a session of its own, labelled a2a:<context>; a key's contexts are its own.
    assert session_of(mgr, alpha, "ctx-1") == ("a2a:ctx-1", ["one", "echo: one", "two", "echo: two"])
    assert session_of(mgr, alpha, "ctx-1", SCOPED)[1] is None, "the key never wrote to context ctx-1"
    assert session_of(mgr, alpha, "s-ctx", SCOPED) == ("a2a:s-ctx", ["one", "echo: one", "two", "echo: two"])
    assert session_of(mgr, alpha, "c" * 200)[0] == ("a2a:" + "c" * 200)[:200]


@pytest.mark.parametrize("configuration", [{"blocking": False}, {"returnImmediately": True}])
def test_a_send_that_asks_not_to_wait_answers_before_the_run_ends(mgr, configuration) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    submitted: list = []
    params = {"message": user("[[reply:later]]"), "configuration": configuration}
    task = a2a.call("message/send", params, "alpha", submit=submitted.append)
    assert task["status"]["state"] == "working" and task["artifacts"] == [] and len(submitted) == 1
    assert a2a.call("tasks/get", {"id": task["id"]}, "alpha")["status"]["state"] == "working"
    submitted[0]()  # the run, where the daemon's executor would run it
    done = a2a.call("tasks/get", {"id": task["id"]}, "alpha")
    assert done["status"]["state"] == "completed" and done["artifacts"][0]["parts"] == [
        {"kind": "text", "text": "later"}]
    # The answer given is a copy, not the task going on.
    assert task["status"]["state"] == "working" and [m["role"] for m in task["history"]] == ["user"]
    assert [m["role"] for m in done["history"]] == ["user", "agent"]
    # Waiting is the default, and the other values of the options wait too.
    for config in (None, {}, {"blocking": True}, {"returnImmediately": False}, {"blocking": "no"}, "no"):
        params = {"message": user("[[reply:now]]")} if config is None else {"message": user("[[reply:now]]"),
                                                                            "configuration": config}
        waited = a2a.call("message/send", params, "alpha", submit=submitted.append)
        assert waited["status"]["state"] == "completed", config
    assert len(submitted) == 1


def test_a_failed_or_refused_run(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    task = a2a.call("message/send", {"message": user("[[fail:400]] no")}, "alpha")
    assert task["status"]["state"] == "failed" and task["artifacts"] == []
    assert sorted(task["status"]) == ["message", "state", "timestamp"] and task["status"]["timestamp"].endswith("+00:00")
    assert a2a._cancels == {}
    message = task["status"]["message"]
    assert (message["role"], message["taskId"], message["contextId"]) == ("agent", task["id"], task["contextId"])
    assert message["parts"] == [{"kind": "text", "text": "message delivery failed: openai model gpt-4o: "
                                                          "HTTP 400: fakellm: scripted failure 400"}]
    assert len(task["history"]) == 1


def test_a_failure_of_the_wait_is_the_tasks_failure(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)

    def broken(ticket):
        ticket.result()
        raise KeyError("lost")

    task = a2a.call("message/send", {"message": user("hi")}, "alpha", wait=broken)
    assert task["status"]["state"] == "failed"
    assert task["status"]["message"]["parts"][0]["text"] == "internal error: KeyError"


def test_tasks_get_history_length_and_not_found(mgr) -> None:
    spawn(mgr, "alpha")
    spawn(mgr, "beta")
    a2a = A2AService(mgr, mgr.runs)
    task = a2a.call("message/send", {"message": user("hi")}, "alpha")
    get = lambda **p: a2a.call("tasks/get", {"id": task["id"], **p}, None)  # noqa: E731
    assert [len(get(historyLength=n)["history"]) for n in (0, 1, 2, 5)] == [0, 1, 2, 2]
    assert get(historyLength=1) == {**task, "history": task["history"][-1:]}
    assert get(historyLength=0) == {**task, "history": []}
    assert get() == task and len(task["history"]) == 2, "a shortened answer leaves the task whole"
    for bad in (-1, True, "1", 1.0):
        assert refused(get, historyLength=bad) == (-32602, "params.historyLength must be a non-negative integer",
                                                   None), bad
    for params in ({}, {"id": ""}, {"id": 5}):
        assert refused(a2a.call, "tasks/get", params, None) == (-32602, "params.id must be the task's id", None)
    not_found = (-32001, "Task not found", {"id": task["id"]})
    assert refused(a2a.call, "tasks/get", {"id": task["id"]}, "beta") == not_found
    assert refused(a2a.call, "tasks/get", {"id": task["id"]}, None, caller=OTHER) == not_found
    assert refused(a2a.call, "tasks/get", {"id": "nope"}, None) == (-32001, "Task not found", {"id": "nope"})
    assert a2a.call("tasks/get", {"id": task["id"]}, "alpha") == task
    mine = a2a.call("message/send", {"message": user("hi")}, "alpha", caller=SCOPED)
    assert a2a.call("tasks/get", {"id": mine["id"]}, None, caller=SCOPED) == mine
    assert refused(a2a.call, "tasks/get", {"id": mine["id"]}, None, caller=OTHER)[0] == -32001
    assert a2a.call("tasks/get", {"id": mine["id"]}, None) == mine, "the admin sees every task"


def test_v1_names_answer_v1_shapes(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    sent = a2a.call("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}]}}, "alpha")
    task = sent["task"]
    assert "kind" not in task and task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["history"][1]["role"] == "ROLE_AGENT"
    got = a2a.call("GetTask", {"id": task["id"]}, "alpha")
    assert got == task
    assert refused(a2a.call, "CancelTask", {"id": task["id"]}, "alpha")[0] == -32002


def test_old_tasks_are_forgotten_past_the_limit(mgr, monkeypatch) -> None:
    spawn(mgr, "alpha")
    monkeypatch.setattr(server, "MAX_TASKS", 2)
    a2a = A2AService(mgr, mgr.runs)
    tasks = [a2a.call("message/send", {"message": user(f"m{n}")}, "alpha") for n in range(3)]
    assert refused(a2a.call, "tasks/get", {"id": tasks[0]["id"]}, None)[0] == -32001
    assert [a2a.call("tasks/get", {"id": t["id"]}, None)["id"] for t in tasks[1:]] == [t["id"] for t in tasks[1:]]
    assert list(a2a._tasks) == [t["id"] for t in tasks[1:]]
    assert set(a2a._task_keys) >= {t["id"] for t in tasks[1:]} and tasks[0]["id"] not in a2a._task_keys
    assert tasks[0]["id"] not in a2a._cancels


def collect(events, until=None) -> list[dict]:
    out = []
    for item in events:
        out.append(item)
        if until is not None and until(item):
            break
    return out


def submit(fn):
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_a_stream_of_one_answer(mgr) -> None:
    alpha = spawn(mgr, "alpha")
    spawn(mgr, "beta")
    a2a = A2AService(mgr, mgr.runs)
    items = collect(a2a.stream(9, "message/stream", {"message": user("[[chunks:3]]", contextId="ctx-s")}, "alpha",
                               submit, alive=lambda: True, poll=0.01))
    assert session_of(mgr, alpha, "ctx-s") == ("a2a:ctx-s", ["[[chunks:3]]", "w1 w2 w3"])
    assert all(i["jsonrpc"] == "2.0" and i["id"] == 9 for i in items)
    results = [i["result"] for i in items]
    first, working = results[0], results[1]
    assert first["kind"] == "task" and first["status"]["state"] == "submitted" and first["artifacts"] == []
    assert working == {"kind": "status-update", "taskId": first["id"], "contextId": first["contextId"],
                       "status": working["status"], "final": False}
    assert working["status"]["state"] == "working"
    chunks = [r for r in results if r["kind"] == "artifact-update"]
    texts = [c["artifact"]["parts"][0]["text"] for c in chunks]
    assert "".join(texts) == "w1 w2 w3"
    assert [(c["append"], c["lastChunk"]) for c in chunks] == [(False, False)] + [(True, False)] * (len(chunks) - 2) \
        + [(True, True)]
    assert texts[-1] == "" and len({c["artifact"]["artifactId"] for c in chunks}) == 1
    artifact_id = chunks[0]["artifact"]["artifactId"]
    assert str(uuid.UUID(artifact_id)) == artifact_id
    assert {c["artifact"]["name"] for c in chunks} == {"response"}
    last = results[-1]
    assert last["kind"] == "status-update" and last["final"] is True and last["status"]["state"] == "completed"
    task = a2a.call("tasks/get", {"id": first["id"]}, None)
    assert task["artifacts"] == [{"artifactId": chunks[0]["artifact"]["artifactId"], "name": "response",
                                  "parts": [{"kind": "text", "text": "w1 w2 w3"}]}]


def test_a_stream_without_text_deltas_sends_the_answer_in_one_chunk(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    events = a2a.stream("s", "message/stream", {"message": user("quiet")}, "alpha", submit, alive=lambda: True,
                        poll=0.01)
    head = [next(events), next(events)]
    assert head[0]["result"]["kind"] == "task"
    # No deltas reach the stream (an emit dropped): the whole answer is the one, last chunk.
    rest = [i["result"] for i in events if not (isinstance(i["result"], dict)
                                               and i["result"].get("kind") == "artifact-update"
                                               and not i["result"]["lastChunk"])]
    final_chunk = [r for r in rest if r["kind"] == "artifact-update"]
    assert final_chunk[-1]["lastChunk"] is True


def test_a_stream_in_v1_names_its_events(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    items = collect(a2a.stream(1, "SendStreamingMessage", {"message": user("hi")}, "alpha", submit,
                               alive=lambda: True, poll=0.01))
    names = [next(iter(i["result"])) for i in items]
    assert names[0] == "task" and names[1] == "statusUpdate" and names[-1] == "statusUpdate"
    assert set(names[2:-1]) == {"artifactUpdate"}
    assert items[-1]["result"]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "kind" not in items[0]["result"]["task"]


def test_a_failed_stream_ends_with_a_failed_status(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    items = collect(a2a.stream(1, "message/stream", {"message": user("[[fail:400]]")}, "alpha", submit,
                               alive=lambda: True, poll=0.01))
    results = [i["result"] for i in items]
    assert [r["kind"] for r in results] == ["task", "status-update", "status-update"]
    assert results[-1]["final"] is True and results[-1]["status"]["state"] == "failed"


def test_a_stream_whose_client_left_stops_the_run(mgr) -> None:
    alpha = spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    here = threading.Event()
    here.set()
    events = a2a.stream(1, "message/stream", {"message": user("[[slow:5]]")}, "alpha", submit,
                        alive=here.is_set, poll=0.01)
    first = next(events)["result"]
    next(events)
    here.clear()
    started = time.monotonic()
    assert list(events) == []
    assert time.monotonic() - started < 3
    task = a2a.call("tasks/get", {"id": first["id"]}, None)
    assert (task["status"]["state"], task["status"]["message"]["parts"]) == \
        ("canceled", [{"kind": "text", "text": "run stopped"}]), "BUG: a stopped task still reads as working"
    assert refused(a2a.call, "tasks/cancel", {"id": first["id"]}, None)[0] == -32002
    assert alpha is not None


def running_task(a2a: A2AService) -> tuple[dict, Iterator]:
    """A slow message streamed to alpha: its task (now working) and the rest of its stream."""
    events = a2a.stream(1, "message/stream", {"message": user("[[slow:5]]")}, "alpha", submit,
                        alive=lambda: True, poll=0.01)
    task = next(events)["result"]
    next(events)
    return task, events


def test_cancel_stops_a_running_task(mgr) -> None:
    spawn(mgr, "alpha")
    spawn(mgr, "beta")
    a2a = A2AService(mgr, mgr.runs)
    task, events = running_task(a2a)
    assert refused(a2a.call, "tasks/cancel", {"id": task["id"]}, "beta") == (
        -32001, "Task not found", {"id": task["id"]}), "another agent's endpoint does not know the task"
    canceled = a2a.call("CancelTask", {"id": task["id"]}, "alpha")
    assert canceled["id"] == task["id"] and canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert set(canceled["status"]) == {"state", "timestamp"} and "kind" not in canceled
    # Canceled (the run still ending): a second cancel is refused at once.
    assert refused(a2a.call, "tasks/cancel", {"id": task["id"]}, None) == (
        -32002, "Task cannot be canceled", {"id": task["id"]})
    rest = [i["result"] for i in events]
    assert rest[-1]["final"] is True and rest[-1]["status"]["state"] == "canceled"
    assert rest[-1]["status"]["message"]["parts"][0]["text"] == "run stopped"
    assert refused(a2a.call, "tasks/cancel", {"id": task["id"]}, None)[0] == -32002
    assert refused(a2a.call, "tasks/cancel", {"id": task["id"]}, None, caller=OTHER)[0] == -32001


def test_cancel_by_its_0_3_name_answers_the_task_in_the_0_3_shape(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    task, events = running_task(a2a)
    canceled = a2a.call("tasks/cancel", {"id": task["id"]}, "alpha")
    assert (canceled["kind"], canceled["id"], canceled["status"]["state"]) == ("task", task["id"], "canceled")
    assert [i["result"] for i in events][-1]["status"]["state"] == "canceled"


class Answer:
    response = "ab"


class Ticket:
    def __init__(self) -> None:
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


def events_of(mgr, items: list, alive=lambda: True, v1: bool = False, poll: float = 0.01) -> tuple[list, Ticket]:
    """The responses `_stream_events` makes of `items` (events of a run, then its outcome)."""
    import queue

    a2a = A2AService(mgr, mgr.runs)
    task = {"kind": "task", "id": "t", "contextId": "c", "status": {"state": "working", "timestamp": "now"},
            "metadata": {}, "history": [], "artifacts": []}
    events: queue.Queue = queue.Queue()
    for item in items:
        events.put(item)
    ticket = Ticket()
    return list(a2a._stream_events(3, v1, task, ticket, events, "art", alive, poll)), ticket


def chunks_of(out: list) -> list[tuple]:
    return [(r["result"]["artifact"]["parts"][0]["text"], r["result"]["append"], r["result"]["lastChunk"])
            for r in out if r and r["result"].get("kind") == "artifact-update"]


def test_text_deltas_are_chunks_and_other_events_are_skipped(mgr) -> None:
    out, ticket = events_of(mgr, [Event("tool_call", {"name": "x"}), Event("text_delta", {"content": ""}),
                                  Event("text_delta", {"content": "a"}), Event("text_delta", {"content": "b"}),
                                  ("result", Answer())])
    assert chunks_of(out) == [("a", False, False), ("b", True, False), ("", True, True)]
    assert ticket.stopped == 0, "a finished stream does not stop its run"
    first = out[0]["result"]
    assert first["status"] == {"state": "submitted", "timestamp": "now"}
    for r in out[2:-1]:
        assert {k: v for k, v in r["result"].items() if k != "artifact"} == {
            "kind": "artifact-update", "taskId": "t", "contextId": "c", "append": r["result"]["append"],
            "lastChunk": r["result"]["lastChunk"]}
        assert r["result"]["artifact"] == {"artifactId": "art", "name": "response",
                                           "parts": r["result"]["artifact"]["parts"]}


def test_an_answer_without_deltas_is_one_last_chunk(mgr) -> None:
    out, _ = events_of(mgr, [("result", Answer())])
    assert chunks_of(out) == [("ab", False, True)]
    v1, _ = events_of(mgr, [("result", Answer())], v1=True)
    assert [r["id"] for r in v1] == [3, 3, 3, 3]
    assert [next(iter(r["result"])) for r in v1] == ["task", "statusUpdate", "artifactUpdate", "statusUpdate"]


@pytest.mark.parametrize("first_event, alive_polls, keepalives", [(False, 5, 2), (True, 5, 2), (False, 4, 2),
                                                                   (False, 3, 1)])
def test_a_keepalive_every_keepalive_interval_of_quiet(mgr, monkeypatch, first_event, alive_polls, keepalives) -> None:
    """Quiet time is counted in polls (poll 1 ms, interval 2 ms: one keep-alive every two empty
    polls, counted from the stream's start or its last event); the stream ends when the client has left."""
    monkeypatch.setattr(server, "KEEPALIVE_SECS", 0.002)
    answers = iter([True] * alive_polls + [False])
    out, ticket = events_of(mgr, [Event("tool_call", {})] if first_event else [], alive=lambda: next(answers),
                            poll=0.001)
    assert out[2:] == [{}] * keepalives
    assert ticket.stopped == 1, "a stream whose client left stops its run"


def test_a_scoped_keys_stream_is_its_own_conversation(mgr) -> None:
    alpha = spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    items = collect(a2a.stream(1, "message/stream", {"message": user("mine", contextId="k-ctx")}, None, submit,
                               alive=lambda: True, poll=0.01, caller=SCOPED))
    assert items[-1]["result"]["status"]["state"] == "completed"
    assert session_of(mgr, alpha, "k-ctx", SCOPED) == ("a2a:k-ctx", ["mine", "echo: mine"])
    assert session_of(mgr, alpha, "k-ctx")[1] is None
    task_id = items[0]["result"]["id"]
    assert refused(a2a.call, "tasks/get", {"id": task_id}, None, caller=OTHER)[0] == -32001


def test_a_client_leaving_is_noticed_within_the_default_poll(mgr) -> None:
    spawn(mgr, "alpha")
    a2a = A2AService(mgr, mgr.runs)
    here = threading.Event()
    here.set()
    events = a2a.stream(1, "message/stream", {"message": user("[[slow:5]]")}, "alpha", submit, alive=here.is_set)
    next(events), next(events)
    here.clear()
    started = time.monotonic()
    assert list(events) == []
    assert time.monotonic() - started < 0.9, "the stream noticed the client's departure late"


def test_an_a2a_run_has_origin_a2a(tmp_path, fake, monkeypatch) -> None:
    from mgrsupport import Recorder

    monkeypatch.setenv("OPENAI_API_KEY", "sk-a2a")
    env = Env(tmp_path / "own", llm_config(fake))
    try:
        mgr = env.manager()
        alpha = mgr.spawn('name = "alpha"\nprofile = "full"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')
        heard = Recorder()
        mgr.runs.kv.on_change = heard
        a2a = A2AService(mgr, mgr.runs)
        task = a2a.call("message/send", {"message": user('[[tool:memory_store {"key": "k", "value": "v"}]]')},
                        "alpha", caller=SCOPED)
        assert task["status"]["state"] == "completed"
        assert heard.calls == [(alpha.id, "k", "v", False, "a2a")], "the agent's tools ran in a run of origin a2a"
    finally:
        env.close()


def test_a_scoped_keys_run_is_paid_by_the_key_and_remembered_as_its_conversation(tmp_path, fake, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-a2a")
    env = Env(tmp_path, llm_config(fake))
    written: list = []
    owners: list = []

    class Memory:
        """The two calls a run makes to the memory service, with whose conversation each is."""

        def context_for_run(self, agent_id, user_text, window, system, owner=None):
            owners.append(owner)

            class Recall:
                def __call__(self) -> str:
                    return system

                def count_accesses(self, tx) -> None:
                    pass
            return Recall()

        def after_exchange(self, agent_id, session_id, user_text, answer, owner=None) -> None:
            owners.append(owner)

    mgr = env.manager(write_usage=lambda tx, rows: written.extend(rows), memory=Memory())
    env.usage.value = lambda handle, provider, model, response, usage=None: usage.append({"model": model})
    try:
        spawn(mgr, "alpha")
        a2a = A2AService(mgr, mgr.runs)
        for caller in (SCOPED, server.ADMIN):
            assert a2a.call("message/send", {"message": user("hi")}, "alpha", caller=caller)["status"]["state"] \
                == "completed"
        assert written == [{"model": "gpt-4o", "key_id": "key-1"}, {"model": "gpt-4o", "key_id": None}]
        assert owners == ["key:key-1", "key:key-1", "", ""]
    finally:
        env.close()

def test_a_run_refused_before_it_starts_is_an_rpc_error(mgr) -> None:
    spawn(mgr, "alpha")
    mgr.spawn('name = "limited"\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
              '[capabilities]\nmax_llm_tokens_per_hour = 1\n')
    a2a = A2AService(mgr, mgr.runs)
    assert refused(a2a.call, "message/send", {"message": user("x" * (64 * 1024 + 1))}, "alpha") == (
        -32602, "message too large (max 64 KB)", {"status": 413})
    assert a2a.call("message/send", {"message": user("one")}, "limited")["status"]["state"] == "completed"
    code, message, data = refused(a2a.call, "message/send", {"message": user("two")}, "limited")
    assert (code, data) == (-32603, {"status": 429}) and message.startswith("message delivery failed: quota exceeded: "), (
        code, message, data)
    assert list(a2a._cancels) == [], "a refused run leaves no task to cancel"


def test_the_versions_served_are_0_3_and_1_0_whatever_their_patch() -> None:
    for header in (None, "", "  ", "0.3", "1.0", "1.0.2", " 1.0 "):
        A2AService.check_version(header)
    for header in ("9.9", "1", "1.1", "0.2.5", "10.0", "1-0"):
        with pytest.raises(RpcError) as refused:
            A2AService.check_version(header)
        assert (refused.value.code, refused.value.data) == (-32009, {"supported": ["0.3", "1.0"]}), header
        assert refused.value.message == f"A2A version {header.strip()} is not supported (supported: 0.3, 1.0)"
    with pytest.raises(RpcError) as refused:
        A2AService.check_version("9" * 30)  # a long header is quoted in part
    assert refused.value.message == f"A2A version {'9' * 20} is not supported (supported: 0.3, 1.0)"
