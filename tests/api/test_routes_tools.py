"""GET /api/tools and an agent's files (GET /api/agents/{id}/uploads[/{file_id}]) on a real daemon."""

from __future__ import annotations

import uuid

import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared

NEW = {  # name -> (family, required, optional, read_only, capability) as offered to models
    "process_start": ("processes", ["command"], ["args"], False, "shell"),
    "process_poll": ("processes", ["process_id"], [], True, "shell"),
    "process_write": ("processes", ["process_id", "data"], [], False, "shell"),
    "process_kill": ("processes", ["process_id"], [], False, "shell"),
    "process_list": ("processes", [], [], True, "shell"),
    "channel_send": ("channels", ["channel", "recipient"],
                     ["subject", "message", "image_url", "file_url", "file_path", "filename", "thread_id"], False, None),
    "browser_navigate": ("browser", ["url"], [], True, "network"),
    "browser_click": ("browser", ["selector"], [], False, "network"),
    "browser_type": ("browser", ["selector", "text"], [], False, "network"),
    "browser_screenshot": ("browser", [], [], True, "network"),
    "browser_read_page": ("browser", [], [], True, "network"),
    "browser_close": ("browser", [], [], True, "network"),
    "browser_scroll": ("browser", [], ["direction", "amount"], True, "network"),
    "browser_wait": ("browser", ["selector"], ["timeout_ms"], True, "network"),
    "browser_back": ("browser", [], [], True, "network"),
    "browser_run_js": ("browser", ["expression"], [], False, "network"),
    "image_analyze": ("media", ["path"], ["prompt"], True, None),
    "media_describe": ("media", ["path"], ["prompt"], True, None),
    "media_transcribe": ("media", ["path"], ["language"], True, None),
    "speech_to_text": ("media", ["path"], ["language"], True, None),
    "text_to_speech": ("media", ["text"], ["voice", "format"], False, None),
    "image_generate": ("media", ["prompt"], ["model", "size", "quality", "count"], False, None),
    "docker_exec": ("containers", ["command"], [], False, "shell"),
}

# The arguments of the other tools, named as the original runtime names them.
ORIGINAL = {
    "file_read": ["path"],
    "file_write": ["content", "path"],
    "file_list": ["path"],
    "create_directory": ["path"],
    "apply_patch": ["patch"],
    "web_fetch": ["body", "headers", "method", "url"],
    "web_search": ["max_results", "query"],
    "shell_exec": ["command", "timeout_seconds"],
    "agent_send": ["agent_id", "message"],
    "agent_spawn": ["manifest_toml"],
    "agent_list": [],
    "agent_kill": ["agent_id"],
    "agent_activate": ["agent_id"],
    "memory_store": ["key", "value"],
    "memory_recall": ["key"],
    "agent_find": ["query"],
    "task_post": ["assigned_to", "description", "title"],
    "task_claim": [],
    "task_complete": ["result", "task_id"],
    "task_list": ["status"],
    "event_publish": ["event_type", "payload"],
    "schedule_create": ["agent", "description", "schedule"],
    "schedule_list": [],
    "schedule_delete": ["id"],
    "knowledge_add_entity": ["entity_type", "name", "properties"],
    "knowledge_add_relation": ["confidence", "properties", "relation", "source", "target"],
    "knowledge_query": ["max_depth", "relation", "source", "target"],
    "cron_create": ["action", "delivery", "name", "one_shot", "schedule"],
    "cron_list": [],
    "cron_cancel": ["job_id"],
    "a2a_discover": ["url"],
    "a2a_send": ["agent_name", "agent_url", "message", "session_id"],
    "system_time": [],
    "skill_list": [],
    "skill_describe": ["name"],
    "skill_execute": ["input", "skill", "tool"],
}


@pytest.fixture(scope="module")
def td(tmp_path_factory, fake_llm):
    extra = '\n[tools]\nchromium_path = "/nonexistent/chromium"\n'
    home = make_home(tmp_path_factory.mktemp("tools"), llm_config(fake_llm, extra))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    yield daemon
    stop_shared(daemon)


def test_every_tool_is_listed_with_family_schema_and_availability(td) -> None:
    r = td.get("/api/tools")
    assert r.status_code == 200
    tools = {t["name"]: t for t in r.json()}
    for t in tools.values():
        assert set(t) == {"name", "family", "description", "parameters", "read_only", "capability", "available",
                          "reason"}
        assert t["parameters"]["type"] == "object" and t["description"]
        assert (t["reason"] is None) == t["available"]
    for name, (family, required, optional, read_only, capability) in NEW.items():
        t = tools[name]
        assert (t["family"], t["parameters"]["required"], t["read_only"], t["capability"]) == \
            (family, required, read_only, capability), name
        assert sorted(t["parameters"]["properties"]) == sorted(required + optional), name
    assert {n: tools[n]["family"] for n in ("file_read", "apply_patch", "shell_exec", "web_fetch", "memory_store",
                                            "knowledge_query", "agent_send", "system_time")} == {
        "file_read": "files", "apply_patch": "files", "shell_exec": "shell", "web_fetch": "web",
        "memory_store": "memory", "knowledge_query": "knowledge", "agent_send": "agents", "system_time": "system"}
    assert tools["shell_exec"]["available"] is True and tools["process_start"]["available"] is True
    for name in NEW:
        if name.startswith("browser_"):
            assert (tools[name]["available"], tools[name]["reason"]) == \
                (False, "chromium not found at /nonexistent/chromium"), name
    assert (tools["docker_exec"]["available"], tools["docker_exec"]["reason"]) == \
        (False, "no container runtime configured ([tools] container_runtime)")
    for name in ("canvas_present", "location_get", "hand_list", "hand_activate"):
        assert name not in tools
    assert {n: sorted(tools[n]["parameters"]["properties"]) for n in ORIGINAL} == ORIGINAL


def test_an_unavailable_tool_called_anyway_says_why(td) -> None:
    name = f"t-{uuid.uuid4().hex[:8]}"
    r = td.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n[capabilities]\nnetwork = ["*"]\n'
                                                      '[model]\nprovider = "default"\nmodel = "default"\n'})
    agent = r.json()["agent_id"]
    r = td.post(f"/api/agents/{agent}/message",
                json={"message": '[[tool:browser_navigate {"url": "https://example.com/"}]]'})
    assert r.json()["response"] == ("tool said: error: 'browser_navigate' is not available in this daemon: "
                                    "chromium not found at /nonexistent/chromium")
    shell = td.post("/api/agents", json={"manifest_toml": f'name = "{name}-sh"\n[capabilities]\nshell = ["*"]\n'
                                                          '[model]\nprovider = "default"\nmodel = "default"\n'})
    r = td.post(f"/api/agents/{shell.json()['agent_id']}/message",
                json={"message": '[[tool:docker_exec {"command": "id"}]]'})
    assert r.json()["response"] == ("tool said: error: 'docker_exec' is not available in this daemon: "
                                    "no container runtime configured ([tools] container_runtime)")


def test_an_agents_files(td) -> None:
    name = f"f-{uuid.uuid4().hex[:8]}"
    agent = td.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n'}).json()["agent_id"]
    assert td.get(f"/api/agents/{agent}/uploads").json() == []
    up = td.post(f"/api/agents/{agent}/upload", files={"file": ("page.html", b"<script>x</script>", "text/html")})
    assert up.status_code == 201
    listed = td.get(f"/api/agents/{agent}/uploads").json()
    assert [(f["file_id"], f["filename"], f["content_type"], f["size"]) for f in listed] == \
        [(up.json()["file_id"], "page.html", "text/html", 18)]
    got = td.get(f"/api/agents/{agent}/uploads/{up.json()['file_id']}")
    # HTML an agent stored never renders in the daemon's origin.
    assert got.content == b"<script>x</script>" and got.headers["Content-Type"] == "application/octet-stream"
    assert got.headers["Content-Disposition"] == 'attachment; filename="page.html"'
    assert td.get(f"/api/agents/{agent}/uploads/{uuid.uuid4()}").status_code == 404
    assert td.get(f"/api/agents/{agent}/uploads/nope").json() == {"error": "invalid file id: 'nope' is not a UUID"}
    page = td.get(f"/agents/{agent}/files")
    assert page.status_code == 200 and "page.html" in page.text and "<img" not in page.text
