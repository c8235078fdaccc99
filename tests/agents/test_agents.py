"""Agents end to end: the real daemon, the fake LLM over HTTP, real tools."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from nacl.signing import SigningKey

from agentd.agents.signing import sign_manifest
from conftest import LLM_ENV, llm_config
from support import Daemon, free_port, make_home, wait_until


def manifest(name: str, extra: str = "", model: str = "") -> str:
    model = model or '[model]\nprovider = "default"\nmodel = "default"\n'
    return f'name = "{name}"\ndescription = "test agent {name}"\ntags = ["test"]\n{extra}\n{model}'


def spawn(d: Daemon, name: str | None = None, extra: str = "", model: str = "") -> str:
    name = name or f"a-{uuid.uuid4().hex[:8]}"
    r = d.post("/api/agents", json={"manifest_toml": manifest(name, extra, model)})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def say(d: Daemon, agent_id: str, text: str, **kwargs):
    return d.post(f"/api/agents/{agent_id}/message", json={"message": text, **kwargs})


# -- spawn, list, detail --------------------------------------------------------------

def test_spawn_list_detail(agent_daemon) -> None:
    d = agent_daemon
    r = d.post("/api/agents", json={"manifest_toml": manifest("lister", 'profile = "Coding"')})
    assert r.status_code == 201
    body = r.json()
    assert body["name"] == "lister" and uuid.UUID(body["agent_id"])
    items = {a["id"]: a for a in d.get("/api/agents").json()}
    item = items[body["agent_id"]]
    for key in ("id", "name", "state", "mode", "created_at", "last_active", "model_provider", "model_name",
                "model_tier", "auth_status", "ready", "profile", "identity"):
        assert key in item, key
    assert item["state"] == "Running" and item["mode"] == "Auto" and item["profile"] == "coding"
    assert item["model_provider"] == "openai" and item["model_name"] == "gpt-4o"
    assert item["auth_status"] == "configured" and item["ready"] is True
    assert set(item["identity"]) == {"emoji", "avatar_url", "color"}
    detail = d.get(f"/api/agents/{body['agent_id']}").json()
    assert detail["model"] == {"provider": "openai", "model": "gpt-4o"}
    assert "shell_exec" in detail["capabilities"]["tools"]
    assert detail["capabilities"]["network"] is True
    assert detail["skills_mode"] == "all" and detail["tags"] == ["test"]
    assert uuid.UUID(detail["session_id"])
    status = d.get("/api/status").json()
    assert any(a["id"] == body["agent_id"] for a in status["agents"])


def test_model_alias_is_normalised(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, model='[model]\nprovider = "openai"\nmodel = "GPT4O"\n')
    assert agent_agent_model(agent_daemon, agent_id) == "gpt-4o"


def agent_agent_model(d: Daemon, agent_id: str) -> str:
    return d.get(f"/api/agents/{agent_id}").json()["model"]["model"]


@pytest.mark.parametrize("toml_text, status, fragment", [
    ('name = 5\n', 400, "invalid manifest format: name"),
    ('name = "x"\n[model]\nmax_tokens = "lots"\n', 400, "model.max_tokens"),
    ('name = "x"\nprofile = "wizard"\n', 400, "profile"),
    ('name = "x"\n[model\n', 400, "TOML syntax error"),
    ('description = "no name"\n', 400, "name"),
    ('name = "x"\n[model]\nprovider = "nonesuch"\nmodel = "m"\n', 400, "unknown provider"),
])
def test_bad_manifests(agent_daemon, toml_text: str, status: int, fragment: str) -> None:
    r = agent_daemon.post("/api/agents", json={"manifest_toml": toml_text})
    assert r.status_code == status and fragment in r.json()["error"], r.text
    assert r.json()["error"].startswith("invalid manifest format")


@pytest.mark.parametrize("nesting, at_limit", [
    ("x = " + "[" * 500 + "]" * 500, "x = " + "[" * 63 + "]" * 63),
    ("x = " + "{a = " * 400 + "1" + "}" * 400, "x = " + "{a = " * 63 + "1" + "}" * 63),
    (".".join(["a"] * 65) + " = 1", ".".join(["a"] * 64) + " = 1"),  # the document is the first level
])
def test_a_manifest_nested_too_deeply_is_a_400(agent_daemon, nesting: str, at_limit: str) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    error = "invalid manifest format: TOML syntax error: nested too deeply (more than 64 levels)"
    r = d.post("/api/agents", json={"manifest_toml": manifest("deep", nesting)})
    assert (r.status_code, r.json()) == (400, {"error": error}), r.text[:300]
    r = d.put(f"/api/agents/{agent_id}/manifest", json={"manifest_toml": manifest("deep", nesting)})
    assert (r.status_code, r.json()) == (400, {"error": error}), r.text[:300]
    assert d.get(f"/api/agents/{agent_id}").json()["name"] != "deep", "the agent is unchanged"
    r = d.post("/api/agents", json={"manifest_toml": manifest("deep", at_limit)})
    assert r.status_code == 201, r.text[:300]
    assert d.delete(f"/api/agents/{r.json()['agent_id']}").status_code == 200


def test_manifest_over_one_megabyte_is_413(agent_daemon) -> None:
    big = 'name = "big"\ndescription = "' + "x" * (1024 * 1024) + '"\n'
    r = agent_daemon.post("/api/agents", json={"manifest_toml": big})
    assert r.status_code == 413 and "1 MB" in r.json()["error"]


def test_a_manifest_of_one_megabyte_is_taken_however_json_escapes_it(agent_daemon) -> None:
    head = 'name = "escaped"\n##'
    accents = head + "é" * ((1024 * 1024 - len(head) - 1) // 2) + "\n"  # sent as \u00e9: three times its size
    lines = 'name = "escaped"\n' + "#\n" * ((1024 * 1024 - 17) // 2)  # \n is two bytes in JSON
    for text in (accents, lines):
        assert len(text.encode()) <= 1024 * 1024
        r = agent_daemon.post("/api/agents", json={"manifest_toml": text})
        assert r.status_code == 201, r.text[:200]
        r = agent_daemon.put(f"/api/agents/{r.json()['agent_id']}/manifest", json={"manifest_toml": text})
        assert r.status_code == 200, r.text[:200]
        assert agent_daemon.delete(f"/api/agents/{r.json()['agent_id']}").status_code == 200
    assert len(accents.encode()) == 1024 * 1024


def test_duplicate_name_is_409(agent_daemon) -> None:
    spawn(agent_daemon, "dup")
    r = agent_daemon.post("/api/agents", json={"manifest_toml": manifest("dup")})
    assert r.status_code == 409


def test_signed_manifest(agent_daemon) -> None:
    key = SigningKey.generate()
    text = manifest("signed-one")
    envelope = sign_manifest(text, key, "tester")
    r = agent_daemon.post("/api/agents", json={"manifest_toml": text, "signed_manifest": envelope})
    assert r.status_code == 201
    tampered = json.loads(sign_manifest(manifest("signed-two"), key))
    tampered["manifest"] = tampered["manifest"].replace("signed-two", "evil-two")
    r = agent_daemon.post("/api/agents", json={"signed_manifest": json.dumps(tampered)})
    assert r.status_code == 403 and "content hash" in r.json()["error"]
    forged = json.loads(sign_manifest(manifest("signed-three"), key))
    forged["signature"][0] ^= 1
    r = agent_daemon.post("/api/agents", json={"signed_manifest": json.dumps(forged)})
    assert r.status_code == 403 and "bad signature" in r.json()["error"]
    other = sign_manifest(manifest("signed-four"), key)
    r = agent_daemon.post("/api/agents", json={"manifest_toml": manifest("signed-five"), "signed_manifest": other})
    assert r.status_code == 403 and "does not match" in r.json()["error"]
    for garbage in ("{nope", "[" * 5000 + "]" * 5000, '{"a": ' * 3000, '{"manifest": "\\ud800"}'):
        r = agent_daemon.post("/api/agents", json={"manifest_toml": manifest("signed-six"), "signed_manifest": garbage})
        assert (r.status_code, r.json()) == (
            403, {"error": "manifest signature verification failed: signed_manifest is not valid JSON"}), garbage[:20]
    # Over 1 MB inside a signed envelope: 413, as for manifest_toml.
    big = manifest("signed-big") + "#" + "x" * (1024 * 1024) + "\n"
    r = agent_daemon.post("/api/agents", json={"signed_manifest": sign_manifest(big, key, "tester")})
    assert (r.status_code, r.json()) == (413, {"error": "manifest too large (max 1 MB)"})


def test_profiles(agent_daemon) -> None:
    profiles = {p["name"]: p["tools"] for p in agent_daemon.get("/api/profiles").json()}
    assert set(profiles) == {"minimal", "coding", "research", "messaging", "automation", "full"}
    assert profiles["minimal"] == ["file_read", "file_list"] and profiles["full"] == ["*"]


# -- messages ---------------------------------------------------------------------------

def test_message_round_trip_with_cost(agent_daemon, fake_llm) -> None:
    agent_id = spawn(agent_daemon)
    r = say(agent_daemon, agent_id, "hello there")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["response"] == "echo: hello there"
    assert body["iterations"] == 1 and body["input_tokens"] > 0 and body["output_tokens"] > 0
    assert isinstance(body["cost_usd"], float) and body["cost_usd"] > 0
    last = [q for q in fake_llm.requests if q["path"].endswith("/chat/completions")][-1]
    assert last["headers"].get("Authorization") == "Bearer test-openai"
    session = agent_daemon.get(f"/api/agents/{agent_id}/session").json()
    assert session["messages"] == [{"role": "User", "content": "hello there"},
                                   {"role": "Assistant", "content": "echo: hello there"}]
    assert session["message_count"] == 2 and session["agent_id"] == agent_id


def test_unpriced_model_gives_null_cost(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, model=(
        '[model]\nprovider = "openai"\nmodel = "my-local-finetune"\n'))
    body = say(agent_daemon, agent_id, "hi").json()
    assert body["response"] == "echo: hi" and body["cost_usd"] is None


def test_anthropic_driver_agent(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, model='[model]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n')
    body = say(agent_daemon, agent_id, "[[think]] hi anthropic").json()
    assert body["response"].strip() == "echo: hi anthropic" and "<think>" not in body["response"]


def test_think_tags_are_stripped(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    body = say(agent_daemon, agent_id, "[[think]] ponder").json()
    assert "secret" not in body["response"] and "ponder" in body["response"]
    body = say(agent_daemon, agent_id, "[[think:unclosed]] again").json()
    assert "never closed" not in body["response"]


def test_message_errors(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = say(d, str(uuid.uuid4()), "hi")
    assert r.status_code == 404 and r.json()["error"] == "agent not found"
    r = say(d, "not-a-uuid", "hi")
    assert r.status_code == 400 and "UUID" in r.json()["error"]
    assert say(d, agent_id, "   ").status_code == 400
    r = say(d, agent_id, "x" * (64 * 1024 + 1))
    assert r.status_code == 413 and "64 KB" in r.json()["error"]
    r = d.post(f"/api/agents/{agent_id}/message", json={"text": "wrong field"})
    assert r.status_code == 400 and "message" in r.json()["error"]
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": 42})
    assert r.status_code == 400


def test_tool_round_trip_writes_into_workspace(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, "writer", 'profile = "coding"')
    body = say(agent_daemon, agent_id, '[[tool:file_write {"path": "notes/a.txt", "content": "hi there"}]]').json()
    assert body["iterations"] == 2
    assert body["response"].startswith("tool said:") and "8 bytes" in body["response"]
    assert (agent_daemon.home / "workspaces" / "writer" / "notes" / "a.txt").read_text() == "hi there"
    session = agent_daemon.get(f"/api/agents/{agent_id}/session").json()
    tools = session["messages"][1]["tools"]
    assert tools[0]["name"] == "file_write" and tools[0]["is_error"] is False


def test_path_traversal_is_denied(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, extra='profile = "coding"')
    for path in ("../../etc/passwd", "/etc/passwd"):
        body = say(agent_daemon, agent_id, f'[[tool:file_read {{"path": "{path}"}}]]').json()
        assert "root:" not in body["response"] and "error" in body["response"].lower()


def test_web_fetch_to_loopback_is_blocked(agent_daemon, fake_llm) -> None:
    agent_id = spawn(agent_daemon, extra='profile = "research"')
    body = say(agent_daemon, agent_id,
               f'[[tool:web_fetch {{"url": "{fake_llm.url}/v1/models"}}]]').json()
    assert body["response"].startswith("tool said: error") and "object" not in body["response"]


def test_tool_not_granted_is_refused(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, extra='profile = "minimal"')
    body = say(agent_daemon, agent_id, '[[tool:shell_exec {"command": "echo hi"}]]').json()
    assert "permission denied" in body["response"]


def test_loop_guard_warns_blocks_and_stops(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, extra='profile = "minimal"\n[autonomous]\nmax_iterations = 100')
    r = say(d, agent_id, '[[tool:file_list {"path": "."} x100]]')
    assert r.status_code == 500
    assert "loop guard" in r.json()["error"] and "30" in r.json()["error"]
    tools = [t for m in d.get(f"/api/agents/{agent_id}/session").json()["messages"] for t in m.get("tools", [])]
    assert len(tools) == 34  # 4 that ran, then 30 blocked
    assert "[loop guard] warning" not in tools[1]["result"]
    assert "[loop guard] warning" in tools[2]["result"] and not tools[2]["is_error"]
    assert tools[4]["is_error"] and "blocked by loop guard" in tools[4]["result"]


def test_max_iterations_ends_the_run(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, extra='profile = "minimal"\n[autonomous]\nmax_iterations = 3')
    body = say(agent_daemon, agent_id, '[[tool:file_list {"path": "."} x10]]').json()
    assert body["iterations"] == 3 and "stopped after 3 iterations" in body["response"]


def test_provider_failures(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = say(d, agent_id, "[[fail:500 times=1]] recover")
    assert r.status_code == 200 and r.json()["response"] == "echo: recover"
    r = say(d, agent_id, "[[fail:429 times=1 retry_after=1]] later")
    assert r.status_code == 200
    r = say(d, agent_id, "[[fail:500]] always")
    assert r.status_code == 500
    error = r.json()["error"]
    assert "openai" in error and "gpt-4o" in error and "500" in error
    r = say(d, agent_id, "[[garbage]]")
    assert r.status_code == 500 and "openai" in r.json()["error"]
    r = say(d, agent_id, "[[hang]]")
    assert r.status_code == 504 and "tim" in r.json()["error"].lower()
    assert d.get("/api/health").ok


def test_missing_key_names_the_env_var(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, model='[model]\nprovider = "groq"\nmodel = "llama-3.3-70b-versatile"\n')
    item = [a for a in agent_daemon.get("/api/agents").json() if a["id"] == agent_id][0]
    assert item["auth_status"] == "missing" and item["ready"] is False
    r = say(agent_daemon, agent_id, "hi")
    assert r.status_code == 424 and "GROQ_API_KEY" in r.json()["error"]


def test_fallback_model_is_used(agent_daemon) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    agent_id = spawn(agent_daemon, model=(
        f'[model]\nprovider = "openai"\nmodel = "gpt-4o"\nbase_url = "{dead}"\n'
        '[[fallback_models]]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n'))
    r = say(agent_daemon, agent_id, "fall back")
    assert r.status_code == 200 and r.json()["response"] == "echo: fall back"


def test_token_quota(agent_daemon) -> None:
    agent_id = spawn(agent_daemon, extra="[capabilities]\nmax_llm_tokens_per_hour = 5")
    assert say(agent_daemon, agent_id, "one two three four five six").status_code == 200
    r = say(agent_daemon, agent_id, "again")
    assert r.status_code == 429
    assert r.json()["error"].startswith("message delivery failed: quota exceeded")
    assert int(r.headers["Retry-After"]) > 0


# -- modes and approvals ---------------------------------------------------------------

def test_mode_changes(agent_daemon) -> None:
    agent_id = spawn(agent_daemon)
    r = agent_daemon.put(f"/api/agents/{agent_id}/mode", json={"mode": "Observe"})
    assert r.json() == {"status": "updated", "agent_id": agent_id, "mode": "Observe"}
    r = agent_daemon.put(f"/api/agents/{agent_id}/mode", json={"mode": "turbo"})
    assert r.status_code == 400 and "Auto" in r.json()["error"]


def test_observe_mode_offers_read_only_tools(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, extra='profile = "coding"')
    d.put(f"/api/agents/{agent_id}/mode", json={"mode": "Observe"})
    tools = d.get(f"/api/agents/{agent_id}").json()["capabilities"]["tools"]
    assert "file_read" in tools and "file_write" not in tools and "shell_exec" not in tools
    body = say(d, agent_id, '[[tool:file_write {"path": "x.txt", "content": "no"}]]').json()
    assert "permission denied" in body["response"]


def _pending(d: Daemon, agent_id: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for approval in d.get("/api/approvals").json():
            if approval["agent_id"] == agent_id:
                return approval
        time.sleep(0.05)
    raise AssertionError("no approval appeared")


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_manual_mode_waits_for_approval(agent_daemon, decision: str) -> None:
    d = agent_daemon
    agent_id = spawn(d, extra='profile = "coding"')
    d.put(f"/api/agents/{agent_id}/mode", json={"mode": "Manual"})
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        r=say(d, agent_id, '[[tool:file_write {"path": "m.txt", "content": "ok"}]]')))
    t.start()
    approval = _pending(d, agent_id)
    assert approval["tool"] == "file_write" and approval["input"]["path"] == "m.txt"
    assert approval["requested_at"]
    assert d.post(f"/api/approvals/{approval['id']}/{decision}").status_code == 200
    t.join(30)
    text = result["r"].json()["response"]
    if decision == "approve":
        assert "wrote 2 bytes" in text
    else:
        assert "denied" in text
    assert d.post(f"/api/approvals/{approval['id']}/approve").status_code == 404


# -- stop, kill, sessions --------------------------------------------------------------

def test_stop_and_kill_cancel_runs(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = d.post(f"/api/agents/{agent_id}/stop")
    assert r.json()["was_running"] is False
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=say(d, agent_id, "[[slow:1.5]] slow one")))
    t.start()
    deadline = time.monotonic() + 30  # a deadline only: the loop ends at the first stop that finds the run
    while time.monotonic() < deadline:
        if d.post(f"/api/agents/{agent_id}/stop").json()["was_running"]:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("run never seen as running")
    t.join(30)
    assert result["r"].status_code == 409 and "cancelled" in result["r"].json()["error"]
    t = threading.Thread(target=lambda: result.update(r=say(d, agent_id, "[[slow:1.5]] killed one")))
    t.start()
    time.sleep(0.3)
    r = d.delete(f"/api/agents/{agent_id}")
    assert r.json() == {"status": "killed", "agent_id": agent_id}
    t.join(30)
    # A message the kill cut off is answered as one sent a moment later: the agent is gone.
    assert (result["r"].status_code, result["r"].json()) == (404, {"error": "agent not found"})
    assert d.get(f"/api/agents/{agent_id}").status_code == 404
    assert d.delete(f"/api/agents/{agent_id}").json()["error"] == "agent not found"
    assert d.get("/api/health").ok


def test_session_delete_and_compact(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    for i in range(8):
        assert say(d, agent_id, f"message number {i}").status_code == 200
    r = d.post(f"/api/agents/{agent_id}/session/compact")
    body = r.json()
    assert body["compacted"] is True and body["kept_messages"] == 10 and body["summarized_messages"] == 6
    messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    assert messages[0]["content"].startswith("[Summary of the earlier conversation]")
    assert len(messages) == 11
    session_id = d.get(f"/api/agents/{agent_id}").json()["session_id"]
    r = d.delete(f"/api/sessions/{session_id}")
    assert r.json() == {"status": "deleted", "session_id": session_id}
    assert d.get(f"/api/agents/{agent_id}/session").json()["message_count"] == 0
    assert d.delete(f"/api/sessions/{uuid.uuid4()}").status_code == 404
    assert d.delete("/api/sessions/nope").status_code == 400
    r = d.post(f"/api/agents/{agent_id}/session/compact")
    assert r.json()["compacted"] is False


# -- uploads and attachments -------------------------------------------------------------

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000a49444154789c63000100000500010d0a2db40000000049454e44ae426082")


def test_image_attachment_reaches_vision_model(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d)
    r = d.post(f"/api/agents/{agent_id}/upload", files={"file": ("dot.png", PNG, "image/png")})
    assert r.status_code == 201
    upload = r.json()
    assert upload["content_type"] == "image/png" and upload["size"] == len(PNG)
    body = say(d, agent_id, "[[echo_params]]", attachments=[{"file_id": upload["file_id"]}]).json()
    assert json.loads(body["response"])["n_images"] == 1


def test_attachment_errors(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, model='[model]\nprovider = "deepseek"\nmodel = "deepseek-chat"\n')
    upload = d.post(f"/api/agents/{agent_id}/upload", files={"file": ("dot.png", PNG, "image/png")}).json()
    r = say(d, agent_id, "look", attachments=[{"file_id": upload["file_id"]}])
    assert r.status_code == 400 and "does not support images" in r.json()["error"]
    r = say(d, agent_id, "look", attachments=[{"file_id": str(uuid.uuid4())}])
    assert r.status_code == 400 and "unknown attachment" in r.json()["error"]
    r = d.post(f"/api/agents/{agent_id}/upload", files={"file": ("x.exe", b"MZ", "application/x-msdownload")})
    assert r.status_code == 400 and "unsupported content type" in r.json()["error"]
    r = d.post(f"/api/agents/{agent_id}/upload", files={"file": ("big.txt", b"x" * (10 * 1024 * 1024 + 10), "text/plain")})
    assert r.status_code == 413
    r = d.post(f"/api/agents/{agent_id}/upload", files={"other": ("a.txt", b"x", "text/plain")})
    assert r.status_code == 400 and "no file" in r.json()["error"]


# -- memory KV ------------------------------------------------------------------------------

def test_kv_memory_is_per_agent(agent_daemon) -> None:
    d = agent_daemon
    a, b = spawn(d), spawn(d)
    assert d.put(f"/api/memory/agents/{a}/kv/color", json="blue").json() == {"status": "ok"}
    d.put(f"/api/memory/agents/{a}/kv/config", json={"depth": 3, "tags": ["x"]})
    assert d.get(f"/api/memory/agents/{a}/kv/color").json() == "blue"
    assert d.get(f"/api/memory/agents/{a}/kv").json() == {"color": "blue", "config": {"depth": 3, "tags": ["x"]}}
    assert d.get(f"/api/memory/agents/{b}/kv").json() == {}
    assert d.get(f"/api/memory/agents/{b}/kv/color").status_code == 404
    assert d.delete(f"/api/memory/agents/{a}/kv/color").json() == {"status": "deleted"}
    assert d.get(f"/api/memory/agents/{a}/kv/color").status_code == 404
    assert d.get(f"/api/memory/agents/{uuid.uuid4()}/kv").status_code == 404
    r = d.put(f"/api/memory/agents/{a}/kv/x", data="{bad", headers={"Content-Type": "application/json"})
    assert r.status_code == 400


def test_memory_tools_use_the_agents_kv(agent_daemon) -> None:
    d = agent_daemon
    agent_id = spawn(d, extra='profile = "messaging"')
    say(d, agent_id, '[[tool:memory_store {"key": "fav", "value": "tea"}]]')
    assert d.get(f"/api/memory/agents/{agent_id}/kv/fav").json() == "tea"
    body = say(d, agent_id, '[[tool:memory_recall {"key": "fav"}]]').json()
    assert "tea" in body["response"]


# -- restart ---------------------------------------------------------------------------------

def test_agents_survive_restart(tmp_path: Path, fake_llm) -> None:
    home = make_home(tmp_path, llm_config(fake_llm))
    d = Daemon(home, env_extra=LLM_ENV).start()
    try:
        agent_id = spawn(d, "keeper")
        say(d, agent_id, "remember me")
        d.put(f"/api/agents/{agent_id}/mode", json={"mode": "Manual"})
        d.put(f"/api/memory/agents/{agent_id}/kv/k", json=[1, 2])
        session_id = d.get(f"/api/agents/{agent_id}").json()["session_id"]
    finally:
        d.stop()
    d = Daemon(home, port=d.port, env_extra=LLM_ENV).start()
    try:
        detail = d.get(f"/api/agents/{agent_id}").json()
        assert detail["name"] == "keeper" and detail["mode"] == "Manual"
        assert detail["session_id"] == session_id
        session = d.get(f"/api/agents/{agent_id}/session").json()
        assert session["messages"][0] == {"role": "User", "content": "remember me"}
        assert d.get(f"/api/memory/agents/{agent_id}/kv/k").json() == [1, 2]
    finally:
        d.stop()


def test_parallel_agents(agent_daemon) -> None:
    ids = [spawn(agent_daemon) for _ in range(8)]
    results: dict[str, str] = {}

    def run(agent_id: str) -> None:
        results[agent_id] = say(agent_daemon, agent_id, f"[[slow:0.3]] from {agent_id}").json()["response"]

    threads = [threading.Thread(target=run, args=(a,)) for a in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {a: f"echo: from {a}" for a in ids}


# -- run records (GET /api/cluster/runs) ----------------------------------------------------

@pytest.mark.parametrize("limit_usd", [0, 50.0])
def test_a_run_is_listed_running_while_in_flight_then_completed(daemon_factory, fake_llm, limit_usd) -> None:
    """Without a budget a lone daemon writes the record when the run ends; with one, at its
    start (with its reservation): a client sees the same either way."""
    d = daemon_factory(llm_config(fake_llm), env_extra=LLM_ENV)
    assert d.put("/api/budget", json={"limit_usd": limit_usd}).status_code == 200
    agent_id = spawn(d)
    done: list = []
    worker = threading.Thread(target=lambda: done.append(say(d, agent_id, "[[slow:2]] hi")))
    worker.start()
    seen: list = []
    wait_until(lambda: seen.append(d.get("/api/cluster/runs", params={"status": "running"}).json()) or seen[-1],
               "the run listed as running", 10)
    running = seen[-1]
    assert [(r["agent_id"], r["status"], r["ended_at"], r["error"], r["cost_usd"]) for r in running] == [
        (agent_id, "running", None, None, None)]
    # Run ids are time-ordered (version 7): the record index grows at its end.
    assert uuid.UUID(running[0]["id"]).version == 7
    assert d.get("/api/cluster/runs", params={"agent_id": agent_id}).json() == running
    assert d.get("/api/cluster/runs", params={"status": "completed"}).json() == []
    worker.join(15)
    assert done[0].status_code == 200, done[0].text
    runs = d.get("/api/cluster/runs").json()
    assert [(r["id"], r["agent_id"], r["status"], r["started_at"]) for r in runs] == [
        (running[0]["id"], agent_id, "completed", running[0]["started_at"])]
    assert runs[0]["ended_at"] >= runs[0]["started_at"] and runs[0]["cost_usd"] == done[0].json()["cost_usd"]
    assert d.get("/api/cluster/runs", params={"status": "running"}).json() == []
