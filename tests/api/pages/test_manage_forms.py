"""The dashboard's management forms over plain HTTP against the real daemon: workflows (create
and edit with the error at the step, run, follow, cancel), memory (search, add, edit, delete,
key-value, graph, export, import, consolidate) and a file attached to a chat message.

Every POST carries the page's CSRF token and answers 303 to a page that shows what happened
(post/redirect/get); the effect is then read back through the JSON API.
"""

from __future__ import annotations

import html as htmllib
import io
import json
import re
import time
import uuid
from typing import Iterator

import pytest
import requests

from support import Daemon

TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')
PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


class Browser:
    """A cookie-keeping HTTP client that reads each form's CSRF token from the page."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.s = requests.Session()
        self.token = ""

    def get(self, path: str) -> requests.Response:
        r = self.s.get(self.d.url + path, timeout=30)
        found = TOKEN.search(r.text)
        if found:
            self.token = found.group(1)
        return r

    def post(self, path: str, data: dict | None = None, files: dict | None = None,
             token: bool = True) -> requests.Response:
        form = dict(data or {})
        if token:
            form["csrf_token"] = self.token
        return self.s.post(self.d.url + path, data=form, files=files, allow_redirects=False, timeout=60)

    def follow(self, r: requests.Response) -> str:
        """The page a 303 leads to (its message included)."""
        assert r.status_code == 303, (r.status_code, r.text[:500])
        return self.get(r.headers["Location"]).text


def note(page: str) -> str:
    found = re.search(r'id="page-note">(.*?)</div>', page, re.S)
    return htmllib.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else ""


@pytest.fixture(scope="module")
def web(agent_daemon: Daemon) -> Iterator[Browser]:
    yield Browser(agent_daemon)


def spawn(d: Daemon) -> tuple[str, str]:
    name = f"m-{uuid.uuid4().hex[:8]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n[model]\nprovider = "default"\n'
                                                      'model = "default"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"], name


def step_fields(i: int, name: str = "", agent: str = "", prompt: str = "", **extra: str) -> dict:
    fields = {f"steps-{i}-name": name, f"steps-{i}-agent_name": agent, f"steps-{i}-prompt": prompt,
              f"steps-{i}-mode": "sequential", f"steps-{i}-error_mode": "fail"}
    fields.update({f"steps-{i}-{k}": v for k, v in extra.items()})
    return fields


def finished(d: Daemon, run_id: str) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        run = d.get(f"/api/workflows/runs/{run_id}").json()
        if run["state"]["status"] in ("completed", "failed"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not end")


# -- workflows ----------------------------------------------------------------------------------

def test_workflow_form_shows_the_error_at_its_step_then_creates_and_edits(web: Browser) -> None:
    d = web.d
    _, agent = spawn(d)
    page = web.get("/workflows/new").text
    assert 'id="step-0"' in page and 'name="steps-0-agent_name"' in page and f'<option value="{agent}">' in page
    form = {"name": "form-made", "description": "from the form",
            **step_fields(0, "draft", agent, "write about {{input}}", output_var="draft"),
            **step_fields(1),   # an empty fieldset is left out
            **step_fields(2, "polish", "nobody-here", "polish {{draft}}")}
    r = web.post("/workflows/new", form)
    assert r.status_code == 400
    # The form comes back without the empty fieldset: the refused step is "Step 2" on both counts.
    error = re.search(r'<p class="error" role="alert" id="step-(\d+)-error">([^<]*)</p>', r.text)
    assert error and error.group(1) == "1"
    assert htmllib.unescape(error.group(2)) == "invalid workflow: step 2 ('polish'): agent: no agent with name " \
                                              "'nobody-here'"
    assert 'id="step-1" aria-invalid="true"' in r.text and 'value="nobody-here" aria-invalid="true"' in r.text
    assert 'value="write about {{input}}"' not in r.text and "write about {{input}}</textarea>" in r.text
    assert [w for w in d.get("/api/workflows").json() if w["name"] == "form-made"] == []
    # Without the page's token nothing is created.
    assert web.post("/workflows/new", {**form, "steps-2-agent_name": agent}, token=False).status_code == 403

    r = web.post("/workflows/new", {**form, "steps-2-agent_name": agent})
    page = web.follow(r)
    workflow_id = r.headers["Location"].split("/")[2].split("?")[0]
    assert note(page) == "workflow form-made created"
    detail = d.get(f"/api/workflows/{workflow_id}").json()
    assert [(s["name"], s["agent"], s["prompt"], s["output_var"]) for s in detail["steps"]] == [
        ("draft", {"name": agent}, "write about {{input}}", "draft"), ("polish", {"name": agent}, "polish {{draft}}", None)]
    assert web.get(r.headers["Location"]).text == page, "a refresh shows the same page and sends nothing"

    # Edit: the form holds the stored steps; an out-of-range timeout is placed at its step.
    page = web.get(f"/workflows/{workflow_id}/edit").text
    assert 'name="steps-1-name" value="polish"' in page and 'name="steps-2-name" value=""' in page
    # A step naming its agent by id shows the agent's name (what the field takes).
    agent_id = next(a["id"] for a in d.get("/api/agents").json() if a["name"] == agent)
    by_id = d.post("/api/workflows", json={"name": "by-id", "steps": [{"agent_id": agent_id}]}).json()["workflow_id"]
    assert f'name="steps-0-agent_name" list="agent-names" value="{agent}"' in web.get(f"/workflows/{by_id}/edit").text
    edit = {"name": "form-made", "description": "edited",
            **step_fields(0, "draft", agent, "write about {{input}}", output_var="draft"),
            **step_fields(1, "polish", agent, "polish {{draft}}", timeout_secs="0")}
    r = web.post(f"/workflows/{workflow_id}/edit", edit)
    assert r.status_code == 400 and 'id="step-1-error"' in r.text and "timeout_secs: must be a positive integer" in r.text
    r = web.post(f"/workflows/{workflow_id}/edit", {**edit, "steps-1-timeout_secs": "30"})
    assert note(web.follow(r)) == "workflow form-made saved"
    detail = d.get(f"/api/workflows/{workflow_id}").json()
    assert detail["description"] == "edited" and detail["steps"][1]["timeout_secs"] == 30


def test_workflow_from_toml_text_and_a_text_error(web: Browser) -> None:
    d = web.d
    _, agent = spawn(d)
    web.get("/workflows/new")
    toml_text = f'name = "from-toml"\n\n[[steps]]\nname = "only"\nagent_name = "{agent}"\nprompt = "hi {{{{input}}}}"\n'
    # A text that does not parse comes back as typed: the name, the text, the box ticked.
    for broken, error in (('name = "wfF"\n[[steps]\nname="x"', "the definition is not valid TOML: "),
                          ('name = "wfF"\nx = ' + "[" * 500 + "]" * 500,
                           "the definition is not valid TOML: nested too deeply (more than 64 levels)"),
                          ('{"name": "wfF", "steps": [', "the definition is not valid JSON: ")):
        r = web.post("/workflows/new", {"name": "wfF", "description": "kept", "use_definition": "1",
                                        "definition": broken, **step_fields(0, "typed-step", agent, "typed prompt")})
        assert r.status_code == 400 and error in r.text, r.text
        assert 'name="name" value="wfF"' in r.text and 'name="description" value="kept"' in r.text
        typed = re.search(r'<textarea name="definition" id="wf-definition"[^>]*>(.*?)</textarea>', r.text, re.S)
        assert htmllib.unescape(typed.group(1)) == broken
        assert 'name="use_definition" value="1" checked>' in r.text
        assert 'name="steps-0-name" value="typed-step"' in r.text and "typed prompt</textarea>" in r.text
    r = web.post("/workflows/new", {"use_definition": "1", "definition": toml_text})
    assert note(web.follow(r)) == "workflow from-toml created"
    workflow_id = r.headers["Location"].split("/")[2].split("?")[0]
    assert d.get(f"/api/workflows/{workflow_id}").json()["steps"][0]["prompt"] == "hi {{input}}"
    # JSON text with a bad step: the message names the step (no fieldset holds it).
    body = {"name": "bad-json", "steps": [{"agent_name": agent}, {"agent_name": agent, "mode": "warp"}]}
    r = web.post("/workflows/new", {"use_definition": "1", "definition": json.dumps(body)})
    assert r.status_code == 400
    assert "invalid workflow: step 2: mode: unknown mode &#39;warp&#39;" in r.text and 'id="step-' not in r.text.split(
        "form-error")[1].split("</p>")[0]


def test_run_from_the_page_follow_its_steps_and_cancel(web: Browser) -> None:
    d = web.d
    _, agent = spawn(d)
    workflow_id = d.post("/api/workflows", json={"name": "slow-two", "steps": [
        {"name": "first", "agent_name": agent, "prompt": "[[slow:0.6]] one {{input}}"},
        {"name": "second", "agent_name": agent, "prompt": "two {{input}}"}]}).json()["workflow_id"]
    web.get(f"/workflows/{workflow_id}")
    r = web.post(f"/workflows/{workflow_id}/run", {"input": "go"})
    assert r.status_code == 303 and r.headers["Location"].startswith("/workflows/runs/")
    run_id = r.headers["Location"].split("/")[3].split("?")[0]
    page = web.follow(r)
    assert note(page) == "run started"
    # Without JavaScript the page shows how far the run is; a refresh shows more.
    assert re.findall(r'data-role="state">([a-z ]+)<', page) in (["running", "waiting"], ["completed", "running"],
                                                                 ["completed", "completed"])
    events = requests.get(f"{d.url}/api/workflows/runs/{run_id}/events", stream=True, timeout=30)
    assert events.headers["Content-Type"].startswith("text/event-stream")
    names = re.findall(r"^event: (\w+)$", events.text, re.M)
    assert names[-1] == "done" and names.count("step_result") == 2
    data = [json.loads(line[6:]) for line in events.text.splitlines() if line.startswith("data: ")]
    assert [x["step_name"] for x in data if "step_name" in x and "status" in x] == ["first", "second"]
    assert data[-1] == {"run_id": run_id, "status": "completed", "output": "echo: two echo: one go", "error": None,
                        "steps_completed": 2}
    page = web.get(f"/workflows/runs/{run_id}").text
    assert re.findall(r'data-role="state">([a-z ]+)<', page) == ["completed", "completed"]
    assert 'id="cancel-run"' not in page and "data-events-url" not in page

    # Cancel a run in progress from its page.
    started = d.post(f"/api/workflows/{workflow_id}/runs", json={"input": "stop me"})
    assert started.status_code == 202 and started.json()["status"] == "running"
    run_id = started.json()["run_id"]
    page = web.get(f"/workflows/runs/{run_id}").text
    assert 'id="cancel-run"' in page and f'data-events-url="/api/workflows/runs/{run_id}/events"' in page
    r = web.post(f"/workflows/runs/{run_id}/cancel")
    assert note(web.follow(r)) == "run cancelled"
    run = finished(d, run_id)
    assert run["state"]["status"] == "failed" and run["error"] == "step 1 ('first') failed: run cancelled"
    r = web.post(f"/workflows/runs/{run_id}/cancel")
    assert note(web.follow(r)) == f"workflow run {run_id} is not in progress (it failed)"
    r = d.post(f"/api/workflows/runs/{run_id}/cancel")
    assert r.status_code == 409 and r.json() == {"error": f"workflow run {run_id} is not in progress (it failed)"}
    assert d.post(f"/api/workflows/runs/{uuid.uuid4()}/cancel").status_code == 404
    # The URL a refused run's page sits at leads back to the workflow when opened again.
    r = web.s.get(f"{d.url}/workflows/{workflow_id}/run", allow_redirects=False)
    assert (r.status_code, r.headers["Location"]) == (303, f"/workflows/{workflow_id}")
    assert d.get(f"/api/workflows/runs/{uuid.uuid4()}/events").status_code == 404


# -- memory --------------------------------------------------------------------------------------

def test_memory_fragments_search_add_edit_delete(web: Browser) -> None:
    d = web.d
    agent_id, name = spawn(d)
    base = f"/api/memory/agents/{agent_id}"
    web.get(f"/agents/{agent_id}/memory")
    r = web.post(f"/agents/{agent_id}/memory/fragments", {"content": "The user drinks green tea every morning",
                                                         "scope": "preferences"})
    assert note(web.follow(r)) == "fragment remembered"
    web.post(f"/agents/{agent_id}/memory/fragments", {"content": "Volcanoes erupt molten rock"})
    listed = d.get(f"{base}/memories").json()["memories"]
    tea = next(m for m in listed if "tea" in m["content"])
    assert tea["scope"] == "preferences" and len(listed) == 2
    r = web.post(f"/agents/{agent_id}/memory/fragments", {"content": "   "})
    assert "content" in note(web.follow(r)) and d.get(f"{base}/memories").json()["total"] == 2
    r = web.post(f"/agents/{agent_id}/memory/fragments", {"content": "Kept <after> a refusal", "scope": "s" * 300})
    page = web.follow(r)
    assert note(page).startswith("scope") and d.get(f"{base}/memories").json()["total"] == 2
    assert ">Kept &lt;after&gt; a refusal</textarea>" in page and f'value="{"s" * 300}"' in page, \
        "what was typed is kept"

    page = web.get(f"/agents/{agent_id}/memory?q=what+does+the+user+like+to+drink").text
    found = re.search(r'<table id="found-table">.*?</table>', page, re.S).group(0)
    assert re.findall(r'<tr data-id="([^"]+)">', found)[0] == tea["id"]

    page = web.get(f"/agents/{agent_id}/memory/fragments/{tea['id']}").text
    assert "The user drinks green tea every morning</textarea>" in page
    r = web.post(f"/agents/{agent_id}/memory/fragments/{tea['id']}", {"content": "The user drinks coffee now",
                                                                      "scope": "preferences"})
    assert note(web.follow(r)) == "fragment saved"
    assert d.get(f"{base}/memories/{tea['id']}").json()["content"] == "The user drinks coffee now"
    assert d.put(f"{base}/memories/{tea['id']}", json={"content": "The user drinks cocoa"}).json()["content"] == \
        "The user drinks cocoa"

    delete = f"/agents/{agent_id}/memory/fragments/{tea['id']}/delete"
    assert f'<a class="button bad" href="{delete}" id="fragment-delete">Delete fragment…</a>' in page
    r = web.post(delete)  # without confirming: the confirmation page, nothing deleted
    assert (r.status_code, r.headers["Location"]) == (303, delete)
    assert f"<h1>Delete this memory fragment of {name}?</h1>" in web.follow(r)
    assert d.get(f"{base}/memories/{tea['id']}").status_code == 200
    r = web.post(delete, {"confirm": "yes"})
    assert note(web.follow(r)) == "fragment deleted"
    assert d.get(f"{base}/memories/{tea['id']}").status_code == 404
    r = web.post(delete, {"confirm": "yes"})
    assert note(web.follow(r)) == f"memory not found: {tea['id']}"


def test_memory_key_values_graph_export_import_consolidate(web: Browser) -> None:
    d = web.d
    agent_id, name = spawn(d)
    base = f"/api/memory/agents/{agent_id}"
    web.get(f"/agents/{agent_id}/memory")
    r = web.post(f"/agents/{agent_id}/memory/kv", {"key": "prefs/colour", "value": '{"main": "blue"}'})
    assert note(web.follow(r)) == "key prefs/colour saved"
    web.post(f"/agents/{agent_id}/memory/kv", {"key": "motto", "value": "carpe diem"})
    assert d.get(f"{base}/kv").json() == {"prefs/colour": {"main": "blue"}, "motto": "carpe diem"}
    page = web.get(f"/agents/{agent_id}/memory?kv_key=prefs/colour").text
    assert 'id="kv-key" name="key" value="prefs/colour"' in page and "&#34;main&#34;: &#34;blue&#34;" in page
    delete = f"/agents/{agent_id}/memory/kv/delete"
    assert f'<a href="{delete}?key=prefs/colour">Delete…</a>' in page
    r = web.post(delete, {"key": "prefs/colour"})  # without confirming: the confirmation page
    assert (r.status_code, r.headers["Location"]) == (303, f"{delete}?key=prefs%2Fcolour")
    asked = web.follow(r)
    assert f"<h1>Delete key prefs/colour of {name}?</h1>" in asked and 'name="key" value="prefs/colour"' in asked
    assert d.get(f"{base}/kv").json() == {"prefs/colour": {"main": "blue"}, "motto": "carpe diem"}
    r = web.post(delete, {"key": "prefs/colour", "confirm": "yes"})
    assert note(web.follow(r)) == "key prefs/colour deleted"
    assert d.get(f"{base}/kv").json() == {"motto": "carpe diem"}
    for key, said in (("", "key must be 1-256 characters"), ("nosuch", "key not found: nosuch")):
        r = web.post(delete, {"key": key, "confirm": "yes"})
        assert note(web.follow(r)) == said
    r = web.post(delete, {"confirm": "yes"})
    assert note(web.follow(r)) == "key must be 1-256 characters"
    r = web.post(f"/agents/{agent_id}/memory/kv", {"key": "k" * 300, "value": '{"kept": true}'})
    page = web.follow(r)
    assert note(page) == "key must be 1-256 characters" and "&#34;kept&#34;: true}</textarea>" in page
    assert d.get(f"{base}/kv").json() == {"motto": "carpe diem"}

    web.get(f"/agents/{agent_id}/memory/graph")
    for entity, kind in (("Ada", "person"), ("Engines", "concept")):
        r = web.post(f"/agents/{agent_id}/memory/graph/entities", {"name": entity, "entity_type": kind})
        assert note(web.follow(r)) == f"entity {entity} saved"
    r = web.post(f"/agents/{agent_id}/memory/graph/relations", {"source": "Ada", "relation": "knows_about",
                                                                "target": "Engines"})
    assert note(web.follow(r)) == "relation Ada knows_about Engines saved"
    r = web.post(f"/agents/{agent_id}/memory/graph/relations", {"source": "Ada", "relation": "knows_about",
                                                                "target": "Nobody"})
    page = web.follow(r)
    assert note(page) == "entity not found: Nobody"
    assert all(f'value="{typed}"' in page for typed in ("Ada", "knows_about", "Nobody")), "what was typed is kept"
    matches = d.post(f"{base}/graph/query", json={"source": "Ada"}).json()["matches"]
    ada, engines = matches[0]["source"]["id"], matches[0]["target"]["id"]
    page = web.get(f"/agents/{agent_id}/memory/graph").text
    assert f'href="/agents/{agent_id}/memory/graph/{ada}">Ada</a>' in page
    page = web.get(f"/agents/{agent_id}/memory/graph/{ada}").text
    outgoing = re.search(r'id="outgoing">.*?</section>', page, re.S).group(0)
    assert "<code>knows_about</code>" in outgoing and f'/memory/graph/{engines}">Engines</a>' in outgoing
    page = web.get(f"/agents/{agent_id}/memory/graph/{engines}").text
    assert f'/memory/graph/{ada}">Ada</a>' in re.search(r'id="incoming">.*?</section>', page, re.S).group(0)

    web.post(f"/agents/{agent_id}/memory/fragments", {"content": "Ada wrote the first program"})
    exported = web.s.get(f"{d.url}/agents/{agent_id}/memory/export", timeout=30)
    assert exported.headers["Content-Disposition"] == f'attachment; filename="memory-{name}.json"'
    document = exported.json()
    assert [m["content"] for m in document["memories"]] == ["Ada wrote the first program"]

    other, _ = spawn(d)
    web.get(f"/agents/{other}/memory")
    r = web.post(f"/agents/{other}/memory/import", files={"document": ("memory.json", io.BytesIO(exported.content),
                                                                       "application/json")})
    assert note(web.follow(r)) == "imported 1 fragment(s), 2 entit(ies), 1 relation(s)"
    assert [m["content"] for m in d.get(f"/api/memory/agents/{other}/memories").json()["memories"]] == \
        ["Ada wrote the first program"]
    r = web.post(f"/agents/{other}/memory/import", files={"document": ("x.json", io.BytesIO(b"{nope"), "text/plain")})
    assert note(web.follow(r)).startswith("the file is not JSON")
    r = web.post(f"/agents/{other}/memory/consolidate")
    assert re.fullmatch(r"consolidated: \d+ merged, \d+ decayed", note(web.follow(r)))


def test_forms_refuse_what_the_json_api_refuses(web: Browser) -> None:
    """JSON the API refuses (NaN, Infinity, 1e400, a lone surrogate, deep nesting) is refused by
    the forms too, on the page with what was typed, never stored nor a 500."""
    d = web.d
    agent_id, agent = spawn(d)
    base = f"/api/memory/agents/{agent_id}"
    web.get(f"/agents/{agent_id}/memory")
    r = web.post(f"/agents/{agent_id}/memory/kv", {"key": "plain", "value": "NaN is a word here"})
    assert note(web.follow(r)) == "key plain saved"
    deep = "[" * 5000 + "]" * 5000
    finite = "malformed JSON: numbers must be finite (no NaN, Infinity or values past 1.8e308)"
    for value, said in (("NaN", finite), ("Infinity", finite), ("-Infinity", finite), ("1e400", finite),
                        ('["\\ud800"]', "malformed JSON: a string holds a lone surrogate (\\ud800-\\udfff without its "
                                          "pair)"),
                        (deep, "JSON nested too deeply")):
        api = d.put(f"{base}/kv/k", data=value, headers={"Content-Type": "application/json"})
        assert (api.status_code, api.json()) == (400, {"error": said}), value[:20]
        page = web.follow(web.post(f"/agents/{agent_id}/memory/kv", {"key": "k", "value": value}))
        assert note(page) == said, value[:20]
        typed = re.search(r'<textarea[^>]*name="value"[^>]*>(.*?)</textarea>', page, re.S)
        # (A value longer than the page carries back is left out.)
        assert htmllib.unescape(typed.group(1)) == (value if len(value) <= 4000 else ""), value[:20]
    listing = d.get(f"{base}/kv")
    assert json.loads(listing.text) == {"plain": "NaN is a word here"}

    web.get("/workflows/new")
    step = step_fields(0, "only", agent, "hi")
    for definition, said in (('{"name": "deep", "x": ' + deep + "}", "not valid JSON: JSON nested too deeply"),
                             ('name = "deep"\nx = ' + deep, "not valid TOML: nested too deeply"),
                             ('{"name": "s\\ud800", "steps": []}', "not valid JSON: a string holds a lone surrogate"),
                             ('{"name": "n", "steps": [{"agent_name": "' + agent + '", "timeout_secs": NaN}]}',
                              "not valid JSON: numbers must be finite")):
        r = web.post("/workflows/new", {"name": "typed", "use_definition": "1", "definition": definition, **step})
        assert r.status_code == 400 and f"the definition is {said}" in htmllib.unescape(r.text), definition[:30]
        kept = re.search(r'<textarea name="definition" id="wf-definition"[^>]*>(.*?)</textarea>', r.text, re.S)
        assert htmllib.unescape(kept.group(1)) == definition and 'name="name" value="typed"' in r.text
    assert [w for w in d.get("/api/workflows").json() if w["name"] in ("deep", "typed")] == []

    nested = b'{"format": "agentd.memory", "version": 1, "memories": ' + deep.encode() + b"}"
    r = web.post(f"/agents/{agent_id}/memory/import", files={"document": ("deep.json", io.BytesIO(nested),
                                                                          "application/json")})
    assert note(web.follow(r)) == "the file is not JSON: JSON nested too deeply"
    assert d.get(f"{base}/memories").json()["total"] == 0


# -- chat uploads --------------------------------------------------------------------------------

def test_chat_message_with_a_file_and_an_image(web: Browser) -> None:
    d = web.d
    agent_id, _ = spawn(d)
    page = web.get(f"/agents/{agent_id}").text
    assert 'enctype="multipart/form-data"' in page and 'type="file" id="attachment" name="attachment"' in page
    r = web.post(f"/agents/{agent_id}/message", {"message": "summarise this"},
                 files={"attachment": ("notes.txt", io.BytesIO(b"line one\nline two"), "text/plain")})
    assert r.status_code == 303 and r.headers["Location"] == f"/agents/{agent_id}#latest"
    messages = d.get(f"/api/agents/{agent_id}/session").json()["messages"]
    assert messages[-2]["content"] == "summarise this\n[attached file notes.txt]\nline one\nline two"
    uploads = d.get(f"/api/agents/{agent_id}/uploads").json()
    assert [(u["filename"], u["size"]) for u in uploads] == [("notes.txt", 17)]

    # An image reaches the model as an image part, and the page links to it.
    r = web.post(f"/agents/{agent_id}/message", {"message": "[[echo_params]]"},
                 files={"attachment": ("dot.png", io.BytesIO(PNG), "image/png")})
    page = web.follow(r)
    reply = json.loads(d.get(f"/api/agents/{agent_id}/session").json()["messages"][-1]["content"])
    assert reply["n_images"] == 1
    image = d.get(f"/api/agents/{agent_id}/uploads").json()[0]
    assert f'href="/agents/{agent_id}/files/{image["file_id"]}">attached: dot.png</a>' in page
    # A refused file: the page says why, keeps the text, and nothing is sent to the model.
    before = len(d.get(f"/api/agents/{agent_id}/session").json()["messages"])
    r = web.post(f"/agents/{agent_id}/message", {"message": "keep me"},
                 files={"attachment": ("tool.exe", io.BytesIO(b"MZ"), "application/x-msdownload")})
    assert r.status_code == 400 and "unsupported content type" in r.text and "keep me</textarea>" in r.text
    assert len(d.get(f"/api/agents/{agent_id}/session").json()["messages"]) == before


def test_agent_pages_answer_at_the_agent_name(web: Browser) -> None:
    """A person types the name: every agent page and form takes it where the id goes."""
    d = web.d
    agent_id, name = spawn(d)
    page = web.get(f"/agents/{name}")
    assert page.status_code == 200 and f'action="/agents/{agent_id}/message"' in page.text
    for path in ("memory", "memory/graph", "edit", "files", "kill"):
        r = web.get(f"/agents/{name}/{path}")
        assert r.status_code == 200 and f"/agents/{agent_id}" in r.text, path
    d.put(f"/api/memory/agents/{agent_id}/kv/colour", json={"value": "blue"})
    assert "blue" in web.get(f"/agents/{name}/memory?kv_key=colour").text
    r = web.post(f"/agents/{name}/message", {"message": "hello by name"})
    assert r.status_code == 303 and r.headers["Location"] == f"/agents/{agent_id}#latest"
    assert d.get(f"/api/agents/{agent_id}/session").json()["messages"][-1]["content"] == "echo: hello by name"
    r = web.post(f"/agents/{name}/memory/kv", {"key": "mood", "value": "calm"})
    assert r.status_code == 303 and d.get(f"/api/memory/agents/{agent_id}/kv/mood").json() == "calm"
    for path in ("/agents/no-such-agent", "/agents/no-such-agent/memory"):
        missing = web.get(path)
        assert missing.status_code == 404 and '<p class="error" role="alert">no agent named &#39;no-such-agent&#39;</p>' \
            in missing.text, path
    assert web.post("/agents/no-such-agent/message", {"message": "hi"}).status_code == 404
    # The JSON API keeps its UUID contract, with the hint.
    r = d.get(f"/api/agents/{name}")
    assert r.status_code == 400 and r.json() == {
        "error": f"invalid agent id: '{name}' is not a UUID: did you mean agent {agent_id}?"}


def test_new_pages_stay_under_the_page_budget(web: Browser) -> None:
    """First load (HTML + CSS + scripts) under 60 KB, with a workflow of 20 steps and a
    memory holding entries of every kind."""
    d = web.d
    agent_id, agent = spawn(d)
    workflow_id = d.post("/api/workflows", json={"name": "long", "steps": [
        {"name": f"step {i}", "agent_name": agent, "prompt": f"part {i}: {{{{input}}}}"} for i in range(20)]}
    ).json()["workflow_id"]
    run_id = d.post(f"/api/workflows/{workflow_id}/runs", json={"input": "x"}).json()["run_id"]
    finished(d, run_id)
    base = f"/api/memory/agents/{agent_id}"
    d.post(f"{base}/entities", json={"entity_type": "person", "name": "Ada"})
    d.post(f"{base}/entities", json={"entity_type": "concept", "name": "Engines"})
    d.post(f"{base}/relations", json={"source": "Ada", "relation": "knows_about", "target": "Engines"})
    fragment = d.post(f"{base}/memories", json={"content": "Ada wrote the first program"}).json()["id"]
    entity = d.post(f"{base}/graph/query", json={"source": "Ada"}).json()["matches"][0]["source"]["id"]
    css = len(web.s.get(f"{d.url}/static/app.css").content)
    scripts = len(web.s.get(f"{d.url}/static/app.js").content) + len(
        web.s.get(f"{d.url}/static/workflow_run.js").content)
    for path in ("/workflows/new", f"/workflows/{workflow_id}/edit", f"/workflows/runs/{run_id}",
                 f"/agents/{agent_id}/memory?q=program", f"/agents/{agent_id}/memory/fragments/{fragment}",
                 f"/agents/{agent_id}/memory/graph", f"/agents/{agent_id}/memory/graph/{entity}"):
        r = web.get(path)
        assert r.status_code == 200, path
        assert "<script>" not in r.text and "onclick" not in r.text
        assert len(r.content) + css + scripts <= 60 * 1024, f"{path}: {len(r.content)} bytes"
