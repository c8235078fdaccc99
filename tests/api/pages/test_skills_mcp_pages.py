"""The Skills and MCP servers pages' forms over a real kernel in process: a skill installed
from a folder or an uploaded zip, deleted, the folder read again; the MCP servers reloaded
from config.toml. Each POST answers 303 with a message, as /api/skills and /api/mcp do."""

from __future__ import annotations

import html as htmllib
import io
import re
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from agentd.api import create_app
from tests.api.pages.test_pages import LOCAL, asks_first, build, token_of

SKILL_MD = "---\nname: {name}\ndescription: Writes {name} notes\n---\nSay {name}.\n"


@pytest.fixture
def dash(tmp_path: Path) -> Iterator[tuple]:
    kernel = build(tmp_path / "home")
    yield create_app(kernel).test_client(), kernel
    kernel.close()


def _note(client, response) -> tuple[str, str]:
    """(the message a form's 303 leads to, that page)."""
    assert response.status_code == 303, response.get_data(as_text=True)[:500]
    page = client.get(response.headers["Location"], environ_base=LOCAL).get_data(as_text=True)
    found = re.search(r'id="page-note">(.*?)</div>', page, re.S)
    return (htmllib.unescape(re.sub(r"<[^>]+>", "", found.group(1))).strip() if found else ""), page


def test_skills_are_installed_deleted_and_read_again_from_the_page(dash, tmp_path: Path) -> None:
    client, kernel = dash
    folder = tmp_path / "release"
    folder.mkdir()
    (folder / "SKILL.md").write_text(SKILL_MD.format(name="release"))
    html = client.get("/skills", environ_base=LOCAL).get_data(as_text=True)
    assert 'id="skill-form"' in html and 'enctype="multipart/form-data"' in html
    token = token_of(html)
    said, _ = _note(client, client.post("/skills/install", data={"csrf_token": token, "path": str(folder)},
                                        environ_base=LOCAL))
    assert said == "skill release installed" and [s["name"] for s in kernel.skills.list()] == ["release"]

    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("notes/SKILL.md", SKILL_MD.format(name="notes"))
    r = client.post("/skills/install", data={"csrf_token": token, "file": (io.BytesIO(archive.getvalue()), "n.zip")},
                    content_type="multipart/form-data", environ_base=LOCAL)
    said, page = _note(client, r)
    assert said == "skill notes installed" and 'data-skill="notes"' in page

    missing = str(tmp_path / "nowhere")
    said, page = _note(client, client.post("/skills/install", data={"csrf_token": token, "path": missing},
                                           environ_base=LOCAL))
    assert missing in said and f'id="skill-path" name="path" value="{missing}"' in page, "what was typed is kept"
    said, _ = _note(client, client.post("/skills/install", data={"csrf_token": token}, environ_base=LOCAL))
    assert said == "give a folder on this machine, a zip's URL or a zip file"

    assert '<a class="button bad" href="/skills/delete?name=release">Delete…</a>' in page
    r = asks_first(client, "/skills/delete", token, "Delete skill release?",
                   lambda: len(kernel.skills.list()) == 2, name="release")
    said, _ = _note(client, r)
    assert said == "skill release deleted" and [s["name"] for s in kernel.skills.list()] == ["notes"]
    said, _ = _note(client, client.post("/skills/delete", data={"csrf_token": token, "name": "release",
                                                                "confirm": "yes"}, environ_base=LOCAL))
    assert said == "no skill named 'release'"
    said, _ = _note(client, client.post("/skills/reload", data={"csrf_token": token}, environ_base=LOCAL))
    assert said == "skills folder read again: 1 of 1 valid"
    assert client.post("/skills/delete", data={"name": "notes"}, environ_base=LOCAL).status_code == 403


def test_mcp_servers_are_reloaded_from_the_page(dash) -> None:
    client, kernel = dash
    html = client.get("/mcp-servers", environ_base=LOCAL).get_data(as_text=True)
    assert 'action="/mcp-servers/reload"' in html
    token = token_of(html)
    said, _ = _note(client, client.post("/mcp-servers/reload", data={"csrf_token": token}, environ_base=LOCAL))
    assert said == "MCP servers reloaded: nothing changed"
    config = kernel.config.config_path
    config.write_text((config.read_text() if config.exists() else "") + '\n[[mcp_servers]]\nname = "broken"\n')
    said, _ = _note(client, client.post("/mcp-servers/reload", data={"csrf_token": token}, environ_base=LOCAL))
    assert said.startswith("config.toml not applied: ") and "mcp_servers" in said
