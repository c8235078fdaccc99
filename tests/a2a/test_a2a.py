"""A2A end to end between two real daemons: the agent cards, a raw JSON-RPC client for
message/send, message/stream and tasks/get (and their errors), and agentd-to-agentd: an agent of
one daemon discovers and messages an agent of the other with a2a_discover / a2a_send.

Daemon `a` is keyless (loopback only); daemon `b` has an API key, and `a` lists b's agent under
`[a2a] agents` with the key's variable, so a2a_send by name carries the key."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
import requests

from conftest import LLM_ENV, llm_config
from support import Daemon, free_port, make_home, wait_until

KEY = "b-secret-key"
FULL = 'profile = "full"'


def spawn(d: Daemon, name: str, extra: str = "", description: str = "") -> str:
    toml = (f'name = "{name}"\ndescription = "{description or "agent " + name}"\ntags = ["a2a", "test"]\n{extra}\n'
            '[model]\nprovider = "default"\nmodel = "default"\n')
    r = d.post("/api/agents", json={"manifest_toml": toml})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, fake_llm):
    a_port, b_port = free_port(), free_port()
    allow = '\n[tools]\nfetch_allow_hosts = ["127.0.0.1"]\n'
    remote = (f'\n[a2a]\nagents = [{{name = "bee", url = "http://127.0.0.1:{b_port}/a2a/agents/bee", '
              'api_key_env = "BEE_KEY"}]\n')
    a = Daemon(make_home(tmp_path_factory.mktemp("a2a-a"), llm_config(fake_llm, allow + remote)), port=a_port,
               env_extra={**LLM_ENV, "BEE_KEY": KEY}).start()
    b = Daemon(make_home(tmp_path_factory.mktemp("a2a-b"), f'api_key = "{KEY}"\n' + llm_config(fake_llm, allow)),
               port=b_port, api_key=KEY, env_extra=LLM_ENV).start()
    spawn(a, "helper", description="Answers questions")
    spawn(a, "caller", FULL)
    spawn(b, "bee", description="The keyed daemon's agent")
    spawn(b, "asker", FULL)
    yield a, b
    b.stop()
    a.stop()


def rpc(d: Daemon, method: str, params: dict, path: str = "/a2a", rpc_id: object = 1, **kw) -> dict:
    r = d.post(path, json={"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}, **kw)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json"), r.text
    body = r.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == rpc_id
    return body


def user(text: str, **extra) -> dict:
    return {"kind": "message", "role": "user", "messageId": str(uuid.uuid4()),
            "parts": [{"kind": "text", "text": text}], **extra}


def test_daemon_card_lists_every_agent_as_a_skill(pair) -> None:
    a, _ = pair
    r = a.get("/.well-known/agent-card.json")
    assert r.status_code == 200
    card = r.json()
    assert card["name"] == "agentd" and card["url"] == f"{a.url}/a2a"
    assert card["protocolVersion"] == "1.0" and card["version"]
    assert card["capabilities"]["streaming"] is True
    assert card["defaultInputModes"] == ["text/plain"] and card["defaultOutputModes"] == ["text/plain"]
    assert card["supportedInterfaces"] == [{"url": f"{a.url}/a2a", "protocolBinding": "JSONRPC",
                                            "protocolVersion": "1.0"}]
    skills = {s["id"]: s for s in card["skills"]}
    assert skills["helper"] == {"id": "helper", "name": "helper", "description": "Answers questions",
                                "tags": ["a2a", "test"], "inputModes": ["text/plain"],
                                "outputModes": ["text/plain"]}
    assert "caller" in skills
    assert "securitySchemes" not in card, "a keyless daemon asks for no credentials"
    assert a.get("/.well-known/agent.json").json() == card
    # A client asks again rather than keep a card whose agents have changed.
    assert r.headers["Cache-Control"] == "no-cache"
    assert a.get("/a2a/agents/helper/.well-known/agent-card.json").headers["Cache-Control"] == "no-cache"


def test_agent_card_per_agent(pair) -> None:
    a, _ = pair
    card = a.get("/a2a/agents/helper/.well-known/agent-card.json").json()
    assert card["name"] == "helper" and card["description"] == "Answers questions"
    assert card["url"] == f"{a.url}/a2a/agents/helper" and [s["id"] for s in card["skills"]] == ["helper"]
    assert a.get("/a2a/agents/helper/.well-known/agent.json").json() == card
    assert {c["name"]: c for c in a.get("/a2a/agents").json()}["helper"] == card
    missing = a.get("/a2a/agents/nobody/.well-known/agent-card.json")
    assert missing.status_code == 404 and missing.json() == {"error": "no agent named 'nobody'"}


def test_keyed_daemon_card_is_public_and_names_the_scheme_but_calls_need_the_key(pair) -> None:
    _, b = pair
    card = requests.get(f"{b.url}/.well-known/agent-card.json", timeout=10)
    assert card.status_code == 200
    described = {"description": "The daemon's API key"}
    assert card.json()["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer", **described,
                                                         "httpAuthSecurityScheme": {"scheme": "Bearer", **described}}}
    assert card.json()["security"] == [{"bearer": []}]
    assert card.json()["securityRequirements"] == [{"schemes": {"bearer": {"list": []}}}]
    # A2A 1.0's schema (protobuf JSON, unknown fields ignored as a 1.0 client reads a card)
    # reads the scheme and the requirement.
    from a2a.types import a2a_pb2 as pb
    from google.protobuf.json_format import ParseDict

    parsed = ParseDict(card.json(), pb.AgentCard(), ignore_unknown_fields=True)
    assert parsed.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(parsed.security_requirements[0].schemes) == ["bearer"]
    assert requests.get(f"{b.url}/a2a/agents/bee/.well-known/agent-card.json", timeout=10).status_code == 200
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": user("hi")}}
    for path in ("/a2a", "/a2a/agents/bee"):
        r = requests.post(f"{b.url}{path}", json=body, timeout=10)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
        r = requests.post(f"{b.url}{path}", json=body, headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 401
    ok = rpc(b, "message/send", {"message": user("keyed hello")}, path="/a2a/agents/bee")
    assert ok["result"]["status"]["state"] == "completed"


def test_a_scoped_key_reaches_only_its_agents_and_its_tasks(pair) -> None:
    _, b = pair
    made = b.post("/api/keys", json={"name": "a2a-bee-only", "scopes": ["read", "message"], "agents": ["bee"]})
    assert made.status_code == 201, made.text
    scoped = {"Authorization": f"Bearer {made.json()['key']}"}
    sent = rpc(b, "message/send", {"message": user("[[reply:scoped]]")}, path="/a2a/agents/bee", headers=scoped)
    assert sent["result"]["status"]["state"] == "completed"
    # An agent outside the key's list is as absent: by path (404) and by metadata.
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": user("hi")}}
    assert b.post("/a2a/agents/asker", json=body, headers=scoped).status_code == 404
    for method in ("message/send", "message/stream"):
        named = rpc(b, method, {"message": user("hi"), "metadata": {"agent": "asker"}}, headers=scoped)
        assert named["error"]["message"] == "no agent named 'asker'", method
    # Only the key's own tasks can be read back; the admin sees them all.
    task_id = sent["result"]["id"]
    other = b.post("/api/keys", json={"name": "a2a-other", "scopes": ["message"]}).json()["key"]
    hidden = rpc(b, "tasks/get", {"id": task_id}, headers={"Authorization": f"Bearer {other}"})
    assert hidden["error"]["code"] == -32001
    assert rpc(b, "tasks/get", {"id": task_id}, headers=scoped)["result"]["id"] == task_id
    assert rpc(b, "tasks/get", {"id": task_id})["result"]["id"] == task_id


def test_a_scoped_key_reads_only_its_agents_cards(pair) -> None:
    _, b = pair
    made = b.post("/api/keys", json={"name": "a2a-cards", "scopes": ["read"], "agents": ["bee"]})
    assert made.status_code == 201, made.text
    scoped = {"Authorization": f"Bearer {made.json()['key']}"}
    for path in ("/.well-known/agent-card.json", "/.well-known/agent.json"):
        assert [s["id"] for s in b.get(path, headers=scoped).json()["skills"]] == ["bee"]
    assert b.get("/a2a/agents/asker/.well-known/agent-card.json", headers=scoped).json() == {
        "error": "no agent named 'asker'"}
    assert b.get("/a2a/agents/asker/.well-known/agent-card.json", headers=scoped).status_code == 404
    assert b.get("/a2a/agents/bee/.well-known/agent-card.json", headers=scoped).json()["name"] == "bee"
    assert [c["name"] for c in b.get("/a2a/agents", headers=scoped).json()] == ["bee"]
    # Without a key (or with a wrong one) the public card lists every agent, as documented.
    for headers in ({"Authorization": None}, {"Authorization": "Bearer wrong"}):
        listed = {s["id"] for s in b.get("/.well-known/agent-card.json", headers=headers).json()["skills"]}
        assert {"bee", "asker"} <= listed
        assert b.get("/a2a/agents/asker/.well-known/agent-card.json", headers=headers).status_code == 200


def test_cross_site_post_is_refused(pair) -> None:
    a, _ = pair
    r = a.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}},
               headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    # DNS rebinding: a page on another name that resolves here gets nothing.
    for path in ("/.well-known/agent-card.json", "/a2a/agents/helper/.well-known/agent-card.json"):
        r = a.get(path, headers={"Host": "evil.example"})
        assert r.status_code == 400 and r.json() == {"error": "host not allowed"}, r.text
    r = a.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}},
               headers={"Host": "evil.example"})
    assert r.status_code == 400


def test_message_send_returns_a_completed_task(pair) -> None:
    a, _ = pair
    body = rpc(a, "message/send", {"message": user("hello over a2a"), "metadata": {"agent": "helper"}}, rpc_id="x1")
    task = body["result"]
    assert task["kind"] == "task" and uuid.UUID(task["id"]) and uuid.UUID(task["contextId"])
    assert task["status"]["state"] == "completed"
    assert task["status"]["message"]["role"] == "agent"
    assert task["status"]["message"]["parts"] == [{"kind": "text", "text": "echo: hello over a2a"}]
    assert [a["parts"] for a in task["artifacts"]] == [[{"kind": "text", "text": "echo: hello over a2a"}]]
    assert [m["role"] for m in task["history"]] == ["user", "agent"]
    assert task["metadata"] == {"agent": "helper"}
    helper_id = next(x["id"] for x in a.get("/api/agents").json() if x["name"] == "helper")
    by_id = rpc(a, "message/send", {"message": user("by id", metadata={"agent_id": helper_id})})["result"]
    assert by_id["metadata"] == {"agent": "helper"} and by_id["status"]["state"] == "completed"
    got = rpc(a, "tasks/get", {"id": task["id"]})["result"]
    assert got["id"] == task["id"] and got["status"]["state"] == "completed"
    assert rpc(a, "tasks/get", {"id": task["id"], "historyLength": 1})["result"]["history"] == task["history"][-1:]
    # An agent's own endpoint knows only that agent's tasks.
    assert rpc(a, "tasks/get", {"id": task["id"]}, path="/a2a/agents/helper")["result"]["id"] == task["id"]
    assert rpc(a, "tasks/get", {"id": task["id"]}, path="/a2a/agents/caller")["error"] == {
        "code": -32001, "message": "Task not found", "data": {"id": task["id"]}}
    # The 1.0 method names answer the 1.0 shapes.
    v1 = rpc(a, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "v1"}]},
                                "metadata": {"agent": "helper"}})["result"]["task"]
    assert v1["status"]["state"] == "TASK_STATE_COMPLETED" and "kind" not in v1
    assert v1["artifacts"][0]["parts"] == [{"text": "echo: v1"}]
    assert rpc(a, "GetTask", {"id": v1["id"]})["result"]["status"]["message"]["role"] == "ROLE_AGENT"


@pytest.mark.parametrize("method, configuration, working", [
    ("message/send", {"blocking": False}, "working"),
    ("SendMessage", {"returnImmediately": True}, "TASK_STATE_WORKING"),
])
def test_a_send_that_asks_not_to_wait_answers_the_working_task(pair, method, configuration, working) -> None:
    a, _ = pair
    message = (user("[[slow:1]] [[reply:later]]") if method == "message/send" else
               {"role": "ROLE_USER", "messageId": "m2", "parts": [{"text": "[[slow:1]] [[reply:later]]"}]})
    began = time.monotonic()
    result = rpc(a, method, {"message": message, "metadata": {"agent": "helper"}, "configuration": configuration})
    task = result["result"] if method == "message/send" else result["result"]["task"]
    assert time.monotonic() - began < 0.9 and task["status"]["state"] == working and not task.get("artifacts")
    get = "tasks/get" if method == "message/send" else "GetTask"
    wait_until(lambda: rpc(a, get, {"id": task["id"]})["result"]["status"]["state"] in ("completed",
                                                                                           "TASK_STATE_COMPLETED"),
               "the task completed")
    done = rpc(a, get, {"id": task["id"]})["result"]
    assert done["artifacts"][0]["parts"][0]["text"] == "later"


def test_a_message_naming_a_task_that_ended_is_refused(pair) -> None:
    a, _ = pair
    path = "/a2a/agents/helper"
    done = rpc(a, "message/send", {"message": user("first")}, path=path)["result"]
    running = rpc(a, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "r1", "parts": [
        {"text": "[[slow:30]] long"}]}, "configuration": {"returnImmediately": True}}, path=path)["result"]["task"]
    assert rpc(a, "CancelTask", {"id": running["id"]}, path=path)["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    for task in (done, running):
        for method, message in (("message/send", user("again", taskId=task["id"])),
                                ("SendMessage", {"role": "ROLE_USER", "messageId": "r2", "taskId": task["id"],
                                                 "parts": [{"text": "again"}]})):
            error = rpc(a, method, {"message": message}, path=path)["error"]
            state = "completed" if task is done else "canceled"
            assert error == {"code": -32004, "data": {"id": task["id"]}, "message": (
                f"task {task['id']} is {state}: it takes no more messages; send to its contextId instead")}
    # Its context goes on.
    again = rpc(a, "message/send", {"message": user("again", contextId=done["contextId"])}, path=path)["result"]
    assert again["status"]["state"] == "completed" and again["contextId"] == done["contextId"]


def test_context_id_is_a_conversation(pair, fake_llm) -> None:
    a, _ = pair
    ctx = f"ctx-{uuid.uuid4().hex}"
    path = "/a2a/agents/helper"
    first = rpc(a, "message/send", {"message": user("remember the word kumquat", contextId=ctx)}, path=path)
    assert first["result"]["contextId"] == ctx
    rpc(a, "message/send", {"message": user("what was the word?", contextId=ctx)}, path=path)
    last = [q for q in fake_llm.requests if q["path"].endswith("/chat/completions")][-1]
    assert "kumquat" in json.dumps(last["json"]), "the second message of a context sees the first"
    rpc(a, "message/send", {"message": user("a new conversation", contextId=f"other-{ctx}")}, path=path)
    last = [q for q in fake_llm.requests if q["path"].endswith("/chat/completions")][-1]
    assert "kumquat" not in json.dumps(last["json"]), "another context is another session"


def sse_events(response: requests.Response) -> Iterator[dict]:
    """The JSON-RPC responses of a stream, read as they arrive."""
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data: "):
            yield json.loads(line[len("data: "):])


def open_stream(d: Daemon, text: str, path: str = "/a2a/agents/helper", rpc_id: object = "s") -> requests.Response:
    """A message/stream request's response, open (use it in a `with` block)."""
    request = {"jsonrpc": "2.0", "id": rpc_id, "method": "message/stream", "params": {"message": user(text)}}
    return d.http.post(f"{d.url}{path}", json=request, stream=True, timeout=30)


def test_message_stream_sends_task_status_artifact_chunks_and_a_final_status(pair) -> None:
    a, _ = pair
    request = {"jsonrpc": "2.0", "id": 7, "method": "message/stream",
               "params": {"message": user("[[chunks:3]]")}}
    with a.http.post(f"{a.url}/a2a/agents/helper", json=request, stream=True, timeout=30,
                     headers={"Accept": "text/event-stream"}) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = list(sse_events(r))
    assert all(e["jsonrpc"] == "2.0" and e["id"] == 7 for e in events)
    results = [e["result"] for e in events]
    assert results[0]["kind"] == "task" and results[0]["status"]["state"] == "submitted"
    task_id = results[0]["id"]
    assert results[1]["kind"] == "status-update" and results[1]["status"]["state"] == "working"
    assert results[1]["final"] is False
    chunks = [r for r in results if r["kind"] == "artifact-update"]
    assert len(chunks) >= 2 and all(c["taskId"] == task_id for c in chunks)
    assert chunks[0]["append"] is False and all(c["append"] for c in chunks[1:])
    assert [c["lastChunk"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(p["text"] for c in chunks for p in c["artifact"]["parts"]) == "w1 w2 w3"
    final = results[-1]
    assert final["kind"] == "status-update" and final["final"] is True and final["status"]["state"] == "completed"
    assert final["status"]["message"]["parts"] == [{"kind": "text", "text": "w1 w2 w3"}]
    assert rpc(a, "tasks/get", {"id": task_id})["result"]["artifacts"][0]["parts"] == [
        {"kind": "text", "text": "w1 w2 w3"}]


def test_a_stream_holds_a_server_slot_until_it_ends(daemon_factory, fake_llm) -> None:
    d = daemon_factory(llm_config(fake_llm).replace("[api]\n", "[api]\nmax_streams = 1\n", 1), env_extra=LLM_ENV)
    spawn(d, "single")
    path = f"{d.url}/a2a/agents/single"
    send = {"jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {"message": user("after")}}
    with open_stream(d, "[[slow:1]] first", "/a2a/agents/single") as r:
        events = sse_events(r)
        assert next(events)["result"]["kind"] == "task"
        busy = requests.post(path, json=send, timeout=30)
        assert (busy.status_code, busy.headers["Retry-After"], busy.json()) == (503, "1", {
            "error": "server busy: too many requests are waiting for agents; try again shortly"})
        last = list(events)[-1]["result"]
    assert (last["final"], last["status"]["state"]) == (True, "completed")
    wait_until(lambda: requests.post(path, json=send, timeout=30).status_code == 200,
               "the ended stream's slot to be given back", timeout=10)


def test_a_failed_run_is_a_failed_task(pair) -> None:
    a, _ = pair
    task = rpc(a, "message/send", {"message": user("[[fail:400]]")}, path="/a2a/agents/helper")["result"]
    assert task["status"]["state"] == "failed" and task["status"]["message"]["parts"][0]["text"]


@pytest.mark.parametrize("body, code", [
    ({"jsonrpc": "1.0", "id": 1, "method": "message/send"}, -32600),
    ({"jsonrpc": "2.0", "method": "message/send"}, -32600),
    ([{"jsonrpc": "2.0", "id": 1, "method": "message/send"}], -32600),
    ({"jsonrpc": "2.0", "id": 1, "method": "no/such"}, -32601),
    ({"jsonrpc": "2.0", "id": 1, "method": "tasks/pushNotificationConfig/set", "params": {}}, -32003),
    ({"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": {"id": "x"}}, -32004),
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}, -32602),
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": []}, -32602),
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send",
      "params": {"message": {"role": "user", "parts": [{"kind": "text", "text": "x"}]}}}, -32602),  # which agent?
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send",
      "params": {"message": {"role": "user", "parts": []}, "metadata": {"agent": "helper"}}}, -32602),
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send",
      "params": {"message": {"role": "user", "parts": [{"kind": "text", "text": "x"}]},
                 "metadata": {"agent": "nobody"}}}, -32602),
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send",
      "params": {"message": {"role": "user", "parts": [{"kind": "file", "file": {"uri": "http://x/y"}}]},
                 "metadata": {"agent": "helper"}}}, -32005),
    ({"jsonrpc": "2.0", "id": 1, "method": "message/send",
      "params": {"message": {"role": "user", "parts": [{"kind": "text", "text": "x"}], "taskId": "no-such-task"},
                 "metadata": {"agent": "helper"}}}, -32001),
    ({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "no-such-task"}}, -32001),
    ({"jsonrpc": "2.0", "id": 1, "method": "tasks/cancel", "params": {"id": "no-such-task"}}, -32001),
])
def test_json_rpc_errors(pair, body, code) -> None:
    a, _ = pair
    r = a.post("/a2a", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["jsonrpc"] == "2.0" and answer["error"]["code"] == code and answer["error"]["message"]
    assert "result" not in answer
    # A readable id is echoed, even on a request refused for another reason; a client matches answers by it.
    assert answer["id"] == (body.get("id") if isinstance(body, dict) else None)


def test_an_a2a_version_not_served_is_refused(pair) -> None:
    a, _ = pair
    v1 = {"message": {"role": "ROLE_USER", "messageId": str(uuid.uuid4()), "parts": [{"text": "versioned"}]}}
    for method in ("SendMessage", "SendStreamingMessage", "GetTask"):
        error = rpc(a, method, v1, path="/a2a/agents/helper", headers={"A2A-Version": "9.9"})["error"]
        assert error == {"code": -32009, "message": "A2A version 9.9 is not supported (supported: 0.3, 1.0)",
                         "data": {"supported": ["0.3", "1.0"]}}
    # The versions served, with or without a patch part; no header is 0.3.
    for version in ("1.0", "1.0.2", "0.3", "0.3.0", ""):
        task = rpc(a, "SendMessage", v1, path="/a2a/agents/helper", headers={"A2A-Version": version})["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", version


def test_parse_error(pair) -> None:
    a, _ = pair
    r = a.post("/a2a", data=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    assert r.json() == {"jsonrpc": "2.0", "id": None,
                        "error": {"code": -32700, "message": "Parse error: the body is not JSON"}}
    deep = a.post("/a2a", data=b"[" * 100000 + b"]" * 100000, headers={"Content-Type": "application/json"})
    assert deep.status_code == 200 and deep.json()["error"]["code"] == -32700


def test_a_body_over_256_kb_is_a_json_rpc_error(pair) -> None:
    a, _ = pair
    request = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "no/such"}).encode()
    at_limit = request[:-1] + b" " * (256 * 1024 - len(request)) + b"}"
    for path in ("/a2a", "/a2a/agents/helper"):
        r = a.post(path, data=at_limit, headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()["id"], r.json()["error"]["code"]) == (200, 7, -32601), r.text
        r = a.post(path, data=at_limit + b" " * (1 if path == "/a2a" else 4 * 1024 * 1024),
                   headers={"Content-Type": "application/json"})
        assert (r.status_code, r.json()) == (200, {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "Invalid Request: body too large (max 256 KB)"}}), r.text
    # As A2A's reference server does, the body is read as JSON whatever its Content-Type says.
    r = a.post("/a2a", data=request, headers={"Content-Type": "text/plain"})
    assert (r.status_code, r.json()["id"], r.json()["error"]["code"]) == (200, 7, -32601), r.text


def test_a_finished_task_cannot_be_canceled(pair) -> None:
    a, _ = pair
    task = rpc(a, "message/send", {"message": user("done soon")}, path="/a2a/agents/helper")["result"]
    error = rpc(a, "tasks/cancel", {"id": task["id"]})["error"]
    assert error["code"] == -32002


def call(tool_name: str, /, **args) -> str:
    return f"[[tool:{tool_name} " + json.dumps(args) + "]]"


def say(d: Daemon, agent: str, text: str) -> str:
    agent_id = next(x["id"] for x in d.get("/api/agents").json() if x["name"] == agent)
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": text})
    assert r.status_code == 200, r.text
    return r.json()["response"]


def test_agentd_to_agentd_send_by_url(pair) -> None:
    a, b = pair
    out = say(b, "asker", call("a2a_send", message="ping from b", agent_url=f"{a.url}/a2a/agents/helper"))
    assert out == "tool said: echo: ping from b"
    # The daemon's endpoint with the agent named in the metadata is not reachable by a bare URL
    # with several agents; the base URL resolves through the daemon's card.
    out = say(b, "asker", call("a2a_send", message="x", agent_url=a.url))
    assert out.startswith("tool said: error: the remote agent refused: name the agent"), out


def test_agentd_to_agentd_discover_then_send_by_name(pair) -> None:
    a, b = pair
    out = say(b, "asker", call("a2a_discover", url=f"{a.url}/a2a/agents/helper"))
    found = json.loads(out[len("tool said: "):])
    assert found["name"] == "helper" and found["url"] == f"{a.url}/a2a/agents/helper"
    assert found["skills"] == [{"id": "helper", "name": "helper", "description": "Answers questions",
                                "tags": ["a2a", "test"]}]
    assert found["protocols"] == ["JSONRPC 1.0"] and found["streaming"] is True and found["auth_required"] is False
    out = say(b, "asker", call("a2a_send", message="by name", agent_name="helper"))
    assert out == "tool said: echo: by name"
    # (the fake model quotes a tool's first 500 characters)
    daemon = say(b, "asker", call("a2a_discover", url=a.url))
    assert daemon.startswith('tool said: {"name": "agentd", "description": ') and '{"id": "helper"' in daemon


@pytest.fixture(scope="module")
def sdk_agent() -> Iterator[str]:
    """The base URL of an agent served by a2a-sdk 1.x with its defaults (it speaks only A2A 1.0)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "sdk_server.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    def up() -> bool:
        try:
            return requests.get(url + ".well-known/agent-card.json", timeout=1).ok
        except requests.ConnectionError:
            return False

    try:
        wait_until(up, "the a2a-sdk agent", timeout=30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_a2a_send_speaks_1_0_to_an_agent_whose_card_offers_only_1_0(pair, sdk_agent) -> None:
    _, b = pair
    assert say(b, "asker", call("a2a_send", message="hello sdk", agent_url=sdk_agent)) == (
        "tool said: sdk-echo: hello sdk")
    out = say(b, "asker", call("a2a_discover", url=sdk_agent))
    assert json.loads(out[len("tool said: "):])["protocols"] == ["JSONRPC 1.0"]
    assert say(b, "asker", call("a2a_send", message="by name", agent_name="sdkagent")) == (
        "tool said: sdk-echo: by name")


def test_configured_remote_agent_gets_the_key(pair) -> None:
    a, _ = pair
    assert say(a, "caller", call("a2a_send", message="to the keyed one", agent_name="bee")) == (
        "tool said: echo: to the keyed one")
    out = say(a, "caller", call("a2a_send", message="x", agent_name="nobody"))
    assert out.startswith("tool said: error: no A2A agent named 'nobody' (known: bee")


def test_ssrf_rules_apply(pair) -> None:
    """Only the allow-listed name reaches loopback: `localhost` is refused like web_fetch refuses it."""
    a, b = pair
    here = f"http://localhost:{a.port}"
    out = say(b, "asker", call("a2a_discover", url=here))
    assert out.startswith("tool said: error: refusing to fetch localhost"), out
    out = say(b, "asker", call("a2a_send", message="x", agent_url=f"{here}/a2a/agents/helper"))
    assert out.startswith("tool said: error: refusing to fetch localhost"), out
    out = say(b, "asker", call("a2a_send", message="x", agent_url="file:///etc/passwd"))
    assert out.startswith("tool said: error: only http and https URLs"), out


def test_the_official_a2a_sdk_client_sends_streams_and_reads_tasks(pair) -> None:
    """a2a-sdk (the A2A project's Python SDK) resolves the card and speaks the 1.0 methods,
    with the key of the keyed daemon."""
    import asyncio

    import httpx
    from a2a.client import ClientConfig, create_client
    from a2a.types import a2a_pb2 as pb

    _, b = pair

    async def exchange(streaming: bool) -> tuple[list, object]:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
            client = await create_client(f"{b.url}/a2a/agents/bee", ClientConfig(streaming=streaming, httpx_client=http))
            message = pb.Message(role=pb.ROLE_USER, message_id=str(uuid.uuid4()),
                                 parts=[pb.Part(text=f"sdk streaming={streaming}")])
            events = [event async for event in client.send_message(pb.SendMessageRequest(message=message))]
            task_id = events[0].task.id
            return events, await client.get_task(pb.GetTaskRequest(id=task_id))

    events, task = asyncio.run(exchange(False))
    assert len(events) == 1 and events[0].task.status.state == pb.TASK_STATE_COMPLETED
    assert [p.text for p in events[0].task.artifacts[0].parts] == ["echo: sdk streaming=False"]
    assert task.id == events[0].task.id and task.status.message.role == pb.ROLE_AGENT
    events, task = asyncio.run(exchange(True))
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "task" and kinds[1] == "status_update" and kinds[-1] == "status_update", kinds
    assert "".join(p.text for e in events if e.HasField("artifact_update") for p in e.artifact_update.artifact.parts) \
        == "echo: sdk streaming=True"
    assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED
    assert task.status.state == pb.TASK_STATE_COMPLETED


def test_tasks_cancel_stops_a_streamed_run(pair) -> None:
    a, _ = pair
    with open_stream(a, "[[slow:20]] never finished") as r:
        events = sse_events(r)
        task_id = next(events)["result"]["id"]
        canceled = rpc(a, "tasks/cancel", {"id": task_id})["result"]
        assert canceled["id"] == task_id and canceled["status"]["state"] == "canceled"
        rest = [e["result"] for e in events]
    assert rest[-1]["kind"] == "status-update" and rest[-1]["final"] is True
    assert rest[-1]["status"]["state"] == "canceled"
    assert rpc(a, "tasks/get", {"id": task_id})["result"]["status"]["state"] == "canceled"
    assert rpc(a, "tasks/cancel", {"id": task_id})["error"]["code"] == -32002


def test_a_client_leaving_a_stream_stops_its_task(pair) -> None:
    a, _ = pair
    with open_stream(a, "[[slow:20]] nobody reads this") as r:
        task_id = next(sse_events(r))["result"]["id"]
    # Noticed within the stream's poll, long before the model call's own time limit (3 s) ends it.
    wait_until(lambda: rpc(a, "tasks/get", {"id": task_id})["result"]["status"]["state"] != "working",
               "the task of the stream its client left to end")
    assert rpc(a, "tasks/get", {"id": task_id})["result"]["status"]["state"] == "canceled"


def a2a_runs(d: Daemon, outcome: str) -> float:
    """The daemon's count of A2A runs that ended with `outcome` (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for family in text_string_to_metric_families(d.get("/metrics").text) for s in family.samples
               if s.name == "agentd_runs_total" and (s.labels["origin"], s.labels["outcome"]) == ("a2a", outcome))


def test_a_client_leaving_a_send_stops_its_run(pair) -> None:
    a, _ = pair
    before = a2a_runs(a, "cancelled")
    send = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": user("[[slow:20]] gone")}}
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(f"{a.url}/a2a/agents/helper", json=send, timeout=1)
    # Stopped, not ended by the model call's own time limit (3 s here) as a failure.
    wait_until(lambda: a2a_runs(a, "cancelled") == before + 1, "the run of the send its client left to stop")


@pytest.mark.parametrize("bad_id", [False, True, 1.5, [1], {"a": 1}])
def test_an_unreadable_id_is_answered_with_a_null_id(pair, bad_id) -> None:
    a, _ = pair
    r = a.post("/a2a", json={"jsonrpc": "2.0", "id": bad_id, "method": "message/send", "params": {}})
    assert r.status_code == 200
    assert r.json() == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": 'invalid JSON-RPC 2.0 request: it needs jsonrpc "2.0", a string method '
                                   "and a string or integer id"}}
