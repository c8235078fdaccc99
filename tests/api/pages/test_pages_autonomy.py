"""The triggers and tasks pages (agentd/api/pages/autonomy.py) over a real kernel in
process: what a row shows (agent, pattern, caps, the paused reason), and the forms
(resume, disable, delete, post a task) doing what the JSON API does."""

from __future__ import annotations

import html as htmllib
import re
from typing import Iterator

import pytest

from agentd.api import create_app
from tests.api.pages.test_pages import LOCAL, asks_first, build, spawn, token_of


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    kernel = build(tmp_path_factory.mktemp("autonomy"))
    yield create_app(kernel), kernel
    kernel.close()


def _row(html: str, row_id: str) -> str:
    match = re.search(rf'<tr id="{row_id}">(.*?)</tr>', html, re.S)
    assert match, f"no row {row_id}"
    return htmllib.unescape(match.group(1))


def test_triggers_page_shows_caps_and_the_paused_reason_and_its_buttons_work(dash) -> None:
    app, kernel = dash
    agent_id = spawn(kernel, "watcher")
    made = kernel.triggers.create({"agent_id": "watcher", "pattern": {"content_match": "deploy <now>"},
                                   "prompt_template": "Look: {{event}}", "max_runs_per_day": 1,
                                   "max_cost_usd_per_day": 0.5})
    assert kernel.triggers.store.admit(made["id"], 6).admitted
    reason = "max_runs_per_day reached: 1 of 1 run(s) today (resumes at 00:00 UTC)"
    client = app.test_client()
    page = client.get("/triggers", environ_base=LOCAL)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "deploy &lt;now&gt;" in html, "the pattern is escaped"
    row = _row(html, f"trigger-{made['id']}")
    assert f'href="/agents/{agent_id}">watcher</a>' in row
    assert '<code>{"content_match": "deploy <now>"}</code>' in row
    assert f'<span class="pill bad">paused</span> <span class="paused-reason">{reason}</span>' in row
    assert '<td class="num">1 / 1</td>' in row and "$0.000000 / $0.500000" in row and ">Resume</button>" in row
    token = token_of(html)
    assert client.post(f"/triggers/{made['id']}/enable", data={"csrf_token": token},
                       environ_base=LOCAL).status_code == 303
    assert kernel.triggers.get(made["id"])["paused"] is False
    assert client.post(f"/triggers/{made['id']}/disable", data={"csrf_token": token},
                       environ_base=LOCAL).status_code == 303
    row = _row(client.get("/triggers", environ_base=LOCAL).get_data(as_text=True), f"trigger-{made['id']}")
    assert '<span class="pill">disabled</span>' in row and ">Enable</button>" in row
    assert client.post(f"/triggers/{made['id']}/enable", data={}, environ_base=LOCAL).status_code == 403
    assert f'<a class="button bad" href="/triggers/{made["id"]}/delete">Delete…</a>' in row
    r = asks_first(client, f"/triggers/{made['id']}/delete", token, "Delete this trigger of watcher?",
                   lambda: len(kernel.triggers.list()) == 1)
    assert r.status_code == 303 and kernel.triggers.list() == []
    r = client.post(f"/triggers/{made['id']}/delete", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 404 and '<p class="error" role="alert">trigger not found</p>' in r.get_data(as_text=True)


def _note(client, response) -> str:
    page = client.get(response.headers["Location"], environ_base=LOCAL).get_data(as_text=True)
    found = re.search(r'id="page-note">(.*?)</div>', page, re.S)
    return htmllib.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else ""


def test_a_trigger_is_added_from_the_form_and_each_button_says_what_it_did(dash) -> None:
    app, kernel = dash
    agent_id = spawn(kernel, "listener")
    client = app.test_client()
    html = client.get("/triggers", environ_base=LOCAL).get_data(as_text=True)
    assert 'action="/triggers" class="stack" id="trigger-form"' in html
    assert '<option value="listener">listener</option>' in html
    token = token_of(html)
    typed = {"csrf_token": token, "agent_id": "listener", "kind": "channel_message", "pattern": "(urgent",
             "channel": "telegram", "prompt_template": "Read this: {{event}}", "max_runs_per_day": "5"}
    r = client.post("/triggers", data=typed, environ_base=LOCAL)
    page = r.get_data(as_text=True)
    assert r.status_code == 400 and kernel.triggers.list(agent_id) == []
    assert ('id="trigger-error">pattern.channel_message.match: invalid regular expression: missing ), '
            'unterminated subpattern at position 0</p>') in page
    assert 'value="(urgent"' in page and "Read this: {{event}}</textarea>" in page
    for field, value, error in (("max_runs_per_day", "lots", "trigger.max_runs_per_day: must be an integer"),
                                ("agent_id", "", "agent_id: choose the agent to run"),
                                ("prompt_template", " ", "prompt_template: must be a non-empty string")):
        r = client.post("/triggers", data={**typed, "pattern": "(?i)urgent", field: value}, environ_base=LOCAL)
        assert r.status_code == 400 and error in htmllib.unescape(r.get_data(as_text=True)), field

    r = client.post("/triggers", data={**typed, "pattern": "(?i)urgent"}, environ_base=LOCAL)
    [made] = kernel.triggers.list(agent_id)
    assert r.status_code == 303 and _note(client, r) == "trigger created for listener"
    assert (made["pattern"], made["prompt_template"], made["max_runs_per_day"]) == (
        {"channel_message": {"channel": "telegram", "match": "(?i)urgent"}}, "Read this: {{event}}", 5)
    r = client.post(f"/triggers/{made['id']}/disable", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 303 and _note(client, r) == "trigger disabled"
    r = client.post(f"/triggers/{made['id']}/enable", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 303 and _note(client, r) == "trigger enabled"
    r = client.post(f"/triggers/{made['id']}/delete", data={"csrf_token": token, "confirm": "yes"},
                    environ_base=LOCAL)
    assert r.status_code == 303 and _note(client, r) == "trigger deleted" and kernel.triggers.list(agent_id) == []


def test_tasks_page_posts_lists_and_deletes(dash) -> None:
    app, kernel = dash
    helper = spawn(kernel, "helper")
    client = app.test_client()
    token = token_of(client.get("/tasks", environ_base=LOCAL).get_data(as_text=True))
    r = client.post("/tasks", data={"title": "Write <notes>", "description": "short", "assigned_to": "helper",
                                    "csrf_token": token}, environ_base=LOCAL)
    [task] = kernel.tasks.list()
    assert r.status_code == 303 and _note(client, r) == "task Write <notes> posted"
    assert r.headers["Location"].endswith(f"#task-{task['id']}")
    assert task["assigned_to"] == helper
    html = client.get("/tasks", environ_base=LOCAL).get_data(as_text=True)
    assert "Write &lt;notes&gt;" in html
    row = _row(html, f"task-{task['id']}")
    assert '<span class="pill pending">pending</span>' in row and "<td>helper</td>" in row
    assert f"task-{task['id']}" not in client.get("/tasks?status=completed", environ_base=LOCAL).get_data(as_text=True)
    r = client.post("/tasks", data={"title": "Tidy <up>", "description": "first\nsecond", "assigned_to": "nobody",
                                    "csrf_token": token}, environ_base=LOCAL)
    html = r.get_data(as_text=True)
    assert r.status_code == 404 and "no agent with id or name &#39;nobody&#39;" in html
    assert ('name="title" required maxlength="200" value="Tidy &lt;up&gt;"' in html
            and ">first\nsecond</textarea>" in html and 'name="assigned_to" value="nobody"' in html), \
        "what was typed is kept"
    assert f'<a class="button bad" href="/tasks/{task["id"]}/delete">Delete…</a>' in row
    r = asks_first(client, f"/tasks/{task['id']}/delete", token, "Delete task Write <notes>?",
                   lambda: len(kernel.tasks.list()) == 1)
    assert r.status_code == 303 and _note(client, r) == "task Write <notes> deleted"
    assert kernel.tasks.list() == []
    r = client.post(f"/tasks/{task['id']}/delete", data={"csrf_token": token}, environ_base=LOCAL)
    assert r.status_code == 404 and "task not found" in r.get_data(as_text=True)


def test_tasks_and_workflows_pages_show_many_a_page(dash) -> None:
    app, kernel = dash
    spawn(kernel, "pager")
    try:
        _many_a_page(app, kernel)
    finally:  # the other tests of this module share the board
        for task in kernel.tasks.list():
            kernel.tasks.delete(task["id"])


def _many_a_page(app, kernel) -> None:
    for i in range(80):
        kernel.tasks.post(f"task {i:03d} " + "t" * 190, "d" * 400)
    for i in range(110):
        kernel.workflows.create({"name": f"flow-{i:03d}", "description": "w" * 900,
                                 "steps": [{"name": "one", "agent_name": "pager", "prompt": "p"}]})
    client = app.test_client()
    # 60 KB with the stylesheet and the script.
    budget = 60_000 - sum(len(client.get(f"/static/{f}").data) for f in ("app.css", "app.js"))
    for path, shown, total in (("/tasks", 30, 80), ("/workflows", 50, 110)):
        pages = [client.get(f"{path}?page={n}", environ_base=LOCAL) for n in (1, 2, 3, 4)]
        texts = [p.get_data(as_text=True) for p in pages]
        assert all(p.status_code == 200 and len(p.data) < budget for p in pages), [len(p.data) for p in pages]
        assert [re.search(r"<span>(\d+–\d+ of \d+) \(page", t).group(1) for t in texts] == \
            [f"1–{shown} of {total}", f"{shown + 1}–{2 * shown} of {total}", f"{2 * shown + 1}–{total} of {total}",
             f"{2 * shown + 1}–{total} of {total}"], "past the end: the last page"
        assert 'rel="next"' in texts[0] and 'rel="next"' not in texts[2] and 'rel="prev"' in texts[2]
    newest = client.get("/tasks", environ_base=LOCAL).get_data(as_text=True)
    assert "task 079 " in newest and "task 049 " not in newest, "the newest tasks come first"
    assert "task 049 " in client.get("/tasks?page=2", environ_base=LOCAL).get_data(as_text=True)


def test_a_trigger_is_edited_from_the_triggers_page(dash) -> None:
    app, kernel = dash
    spawn(kernel, "edited")
    made = kernel.triggers.create({"agent_id": "edited", "pattern": {"content_match": "deploy"},
                                   "prompt_template": "Look: {{event}}", "max_runs_per_day": 4})
    client = app.test_client()
    html = client.get("/triggers", environ_base=LOCAL).get_data(as_text=True)
    assert f'href="/triggers?edit={made["id"]}#edit-trigger">Edit</a>' in _row(html, f"trigger-{made['id']}")
    html = client.get(f"/triggers?edit={made['id']}", environ_base=LOCAL).get_data(as_text=True)
    form = re.search(r'<form [^>]*id="trigger-edit-form">.*?</form>', html, re.S).group(0)
    assert f'action="/triggers/{made["id"]}/edit"' in form and ">Look: {{event}}</textarea>" in form
    assert 'name="max_runs_per_day" value="4"' in form
    token = token_of(html)
    typed = {"prompt_template": "Now: {{event}}", "max_runs_per_day": "", "max_cost_usd_per_day": "0.25",
             "rate_limit_per_minute": "0", "csrf_token": token}
    r = client.post(f"/triggers/{made['id']}/edit", data=typed, environ_base=LOCAL)
    page = r.get_data(as_text=True)
    assert r.status_code == 400 and "trigger.rate_limit_per_minute: must be an integer between 1 and 1000000" in page
    assert ">Now: {{event}}</textarea>" in page and 'name="max_cost_usd_per_day" value="0.25"' in page
    assert kernel.triggers.get(made["id"])["prompt_template"] == "Look: {{event}}", "a refused edit changes nothing"
    r = client.post(f"/triggers/{made['id']}/edit", data={**typed, "rate_limit_per_minute": "3"}, environ_base=LOCAL)
    assert r.status_code == 303 and _note(client, r) == "trigger saved for edited"
    saved = kernel.triggers.get(made["id"])
    assert (saved["prompt_template"], saved["max_runs_per_day"], saved["max_cost_usd_per_day"],
            saved["rate_limit_per_minute"]) == ("Now: {{event}}", None, 0.25, 3)
    missing = "00000000-0000-0000-0000-000000000000"
    assert client.get(f"/triggers?edit={missing}", environ_base=LOCAL).status_code == 404
    assert client.post(f"/triggers/{missing}/edit", data=typed, environ_base=LOCAL).status_code == 404
    kernel.triggers.delete(made["id"])
