"""Skills end to end: install from a folder, a zip upload and an allowed URL, list, delete,
reload; what an agent sees (one line per permitted skill in the prompt the model receives,
the instructions through skill_describe / skill_execute called by the fake LLM), path
traversal refused, bad front matter reported by the API and by `agentd doctor`."""

from __future__ import annotations

import http.server
import io
import json
import threading
import uuid
import zipfile
from pathlib import Path

import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, run_cli

SKILL_MD = """---
name: {name}
description: {description}
---
# How to {name}

Step one: {secret}.
"""


def write_skill(root: Path, name: str, description: str = "Writes release notes", secret: str = "s1",
                files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(SKILL_MD.format(name=name, description=description, secret=secret))
    for rel, text in (files or {}).items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def zip_of(entries: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in entries.items():
            zf.writestr(name, text)
    return buf.getvalue()


class _Archive(http.server.BaseHTTPRequestHandler):
    payload = b""

    def do_GET(self) -> None:  # noqa: N802 - the handler's API
        self.send_response(200)
        self.send_header("Content-Type", "application/zip")
        self.send_header("Content-Length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def archive_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Archive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def home(tmp_path_factory, fake_llm) -> Path:
    # "localhost" may fetch (loopback through the allow-list); 127.0.0.1 may not.
    home = make_home(tmp_path_factory.mktemp("skills"),
                     llm_config(fake_llm, '\n[tools]\nfetch_allow_hosts = ["localhost"]\n'))
    write_skill(home / "skills", "release-notes", files={"templates/notes.md": "## Notes template"})
    write_skill(home / "skills", "summarise", "Summarises long texts", secret="s2")
    broken = home / "skills" / "broken"
    broken.mkdir(parents=True)
    (broken / "SKILL.md").write_text("---\nname: Not A Valid Name\n---\nbody\n")
    (home / "outside.txt").write_text("secret outside the skill")
    return home


@pytest.fixture(scope="module")
def d(home) -> Daemon:
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    yield daemon
    daemon.stop()


def listing(d: Daemon) -> dict[str, dict]:
    r = d.get("/api/skills")
    assert r.status_code == 200, r.text
    return {s["name"]: s for s in r.json()}


def spawn(d: Daemon, extra: str = "") -> str:
    name = f"sk-{uuid.uuid4().hex[:8]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n{extra}\n[model]\nprovider = "default"\n'
                                                     'model = "default"\n'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def say(d: Daemon, agent_id: str, text: str) -> str:
    r = d.post(f"/api/agents/{agent_id}/message", json={"message": text})
    assert r.status_code == 200, r.text
    return r.json()["response"]


def call(tool_name: str, /, **args) -> str:
    return f"[[tool:{tool_name} " + json.dumps(args) + "]]"


def test_listing_shows_valid_and_invalid_skills(d: Daemon, home: Path) -> None:
    skills = listing(d)
    notes = skills["release-notes"]
    assert notes == {"name": "release-notes", "description": "Writes release notes",
                     "path": str(home / "skills" / "release-notes"), "files": ["SKILL.md", "templates/notes.md"],
                     "valid": True, "errors": []}
    broken = skills["broken"]
    assert broken["valid"] is False and broken["name"] == "broken"
    assert any("'name'" in e for e in broken["errors"]) and any("'description'" in e for e in broken["errors"])


def test_install_from_a_folder_then_delete(d: Daemon, tmp_path: Path) -> None:
    source = write_skill(tmp_path, "from-folder", "Installed from a folder")
    r = d.post("/api/skills/install", json={"path": str(source)})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "from-folder" and r.json()["valid"] is True
    assert (d.home / "skills" / "from-folder" / "SKILL.md").is_file()
    assert "from-folder" in listing(d)
    again = d.post("/api/skills/install", json={"path": str(source)})
    assert again.status_code == 409 and "already installed" in again.json()["error"]
    r = d.delete("/api/skills/from-folder")
    assert (r.status_code, r.json()) == (200, {"status": "removed", "name": "from-folder"})
    assert "from-folder" not in listing(d) and not (d.home / "skills" / "from-folder").exists()
    assert d.delete("/api/skills/from-folder").status_code == 404


def test_install_refusals(d: Daemon, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "SKILL.md").write_text("---\nname: bad\n---\nno description\n")
    r = d.post("/api/skills/install", json={"path": str(bad)})
    assert r.status_code == 400 and "'description'" in r.json()["error"]
    assert d.post("/api/skills/install", json={"path": str(tmp_path / "none")}).status_code == 400
    assert d.post("/api/skills/install", json={"path": "relative/dir"}).status_code == 400
    r = d.post("/api/skills/install", json={"path": "/x", "url": "http://localhost/x.zip"})
    assert r.status_code == 400 and "exactly one" in r.json()["error"]
    # A link out of the folder is not copied in.
    linked = write_skill(tmp_path, "linked")
    (linked / "passwd").symlink_to("/etc/passwd")
    r = d.post("/api/skills/install", json={"path": str(linked)})
    assert r.status_code == 400 and "symbolic link" in r.json()["error"]


def test_zip_upload_and_zip_slip(d: Daemon) -> None:
    data = zip_of({"zipped/SKILL.md": SKILL_MD.format(name="zipped", description="From a zip", secret="z"),
                   "zipped/scripts/run.sh": "echo hi\n"})
    r = d.post("/api/skills/install", files={"file": ("zipped.zip", data, "application/zip")})
    assert r.status_code == 201, r.text
    assert r.json()["files"] == ["SKILL.md", "scripts/run.sh"]
    evil = zip_of({"SKILL.md": SKILL_MD.format(name="evil", description="x", secret="x"),
                   "../../escaped.txt": "pwned"})
    r = d.post("/api/skills/install", files={"file": ("evil.zip", evil, "application/zip")})
    assert r.status_code == 400 and "outside the skill folder" in r.json()["error"]
    assert not (d.home / "escaped.txt").exists() and "evil" not in listing(d)
    r = d.post("/api/skills/install", files={"file": ("x.zip", b"not a zip", "application/zip")})
    assert r.status_code == 400 and "not a zip" in r.json()["error"]
    big = d.post("/api/skills/install", files={"file": ("big.zip", b"0" * (10 * 1024 * 1024 + 10), "application/zip")})
    assert big.status_code == 413
    assert not [p for p in (d.home / "skills").iterdir() if p.name.startswith(".")], "staging left behind"


def test_a_zip_with_an_unusable_skill_md_installs_nothing(d: Daemon) -> None:
    deep = "---\nname: deep\ndescription: d\nx: " + "[" * 5000 + "]" * 5000 + "\n---\n"
    for name, text, error in [
        ("deep", deep, "invalid skill: SKILL.md front matter is nested too deeply"),
        ("latin", b"---\nname: latin\ndescription: \xff\xfe\n---\n", "invalid skill: SKILL.md is not UTF-8 text"),
    ]:
        archive = zip_of({"SKILL.md": text})
        r = d.post("/api/skills/install", files={"file": (f"{name}.zip", archive, "application/zip")})
        assert (r.status_code, r.json()) == (400, {"error": error}), r.text
        assert name not in listing(d) and not (d.home / "skills" / name).exists()
    assert not [p for p in (d.home / "skills").iterdir() if p.name.startswith(".")], "staging left behind"


def test_install_from_url_only_from_allowed_hosts(d: Daemon, archive_server) -> None:
    _Archive.payload = zip_of({"SKILL.md": SKILL_MD.format(name="fetched", description="From a URL", secret="u")})
    port = archive_server.server_address[1]
    r = d.post("/api/skills/install", json={"url": f"http://127.0.0.1:{port}/s.zip"})
    assert r.status_code == 400 and "fetch_allow_hosts" in r.json()["error"]
    r = d.post("/api/skills/install", json={"url": f"http://localhost:{port}/s.zip"})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "fetched"


def test_reload_picks_up_folders_added_on_disk(d: Daemon) -> None:
    write_skill(d.home / "skills", "dropped-in", "Copied by hand")
    deep = d.home / "skills" / "deep-by-hand"
    deep.mkdir()
    (deep / "SKILL.md").write_text("---\nname: deep-by-hand\ndescription: d\nx: " + "[" * 5000 + "]" * 5000 + "\n---\n")
    assert "dropped-in" not in listing(d)
    r = d.post("/api/skills/reload")
    assert r.status_code == 200, r.text
    skills = {s["name"]: s for s in r.json()}
    assert skills["dropped-in"]["valid"] is True
    assert (skills["deep-by-hand"]["valid"], skills["deep-by-hand"]["errors"]) == (
        False, ["SKILL.md front matter is nested too deeply"])
    assert d.delete("/api/skills/deep-by-hand").status_code == 200


def test_a_folder_naming_another_skill_never_stands_in_for_it(d: Daemon) -> None:
    root = d.home / "skills"
    write_skill(root, "alpha", "The real alpha", secret="real")
    impostor = root / "beta"
    impostor.mkdir()
    (impostor / "SKILL.md").write_text(SKILL_MD.format(name="alpha", description="An impostor", secret="fake"))
    r = d.post("/api/skills/reload")
    assert r.status_code == 200, r.text
    skills = {s["name"]: s for s in r.json()}
    assert skills["alpha"]["valid"] is True and skills["alpha"]["path"] == str(root / "alpha")
    assert skills["beta"]["valid"] is False and skills["beta"]["path"] == str(impostor)
    assert skills["beta"]["errors"] == ["front matter name 'alpha' does not match its folder 'beta'"]
    agent = spawn(d, 'skills = ["alpha"]')
    assert "Step one: real." in say(d, agent, call("skill_describe", name="alpha"))
    # Each folder is deleted by its own name.
    assert d.delete("/api/skills/beta").status_code == 200
    assert (root / "alpha").is_dir() and not impostor.exists()
    assert d.delete("/api/skills/alpha").status_code == 200 and not (root / "alpha").exists()


def test_agent_sees_permitted_skills_as_one_line_each(d: Daemon, fake_llm) -> None:
    everything = spawn(d)
    system = json.loads(say(d, everything, "[[echo_params]]"))["system"]
    assert "- release-notes: Writes release notes" in system
    assert "Step one: s1" not in system, "the instructions load on demand, not in the prompt"
    assert "broken" not in system
    only = spawn(d, 'skills = ["summarise"]')
    system = json.loads(say(d, only, "[[echo_params]]"))["system"]
    assert "- summarise: Summarises long texts" in system and "release-notes" not in system


def test_skill_tools_through_the_model(d: Daemon) -> None:
    agent = spawn(d, 'skills = ["release-notes"]')
    out = say(d, agent, call("skill_describe", name="release-notes"))
    assert out.startswith("tool said: # release-notes\nWrites release notes\n\n# How to release-notes")
    assert "Step one: s1." in out and "- templates/notes.md" in out
    listed = json.loads(say(d, agent, call("skill_list"))[len("tool said: "):])
    assert listed == [{"name": "release-notes", "description": "Writes release notes",
                       "files": ["SKILL.md", "templates/notes.md"]}]
    assert say(d, agent, call("skill_execute", skill="release-notes", tool="templates/notes.md")) == (
        "tool said: ## Notes template")
    out = say(d, agent, call("skill_execute", skill="release-notes"))
    assert out.startswith("tool said: Follow the instructions of skill 'release-notes':") and "Step one: s1." in out
    # Not in this agent's allow-list.
    out = say(d, agent, call("skill_describe", name="summarise"))
    assert out == "tool said: error: no skill named 'summarise' is available to this agent (available: release-notes)"


@pytest.mark.parametrize("path", ["../../outside.txt", "/etc/passwd", "templates/../../../outside.txt", "."])
def test_skill_files_are_confined_to_the_skill(d: Daemon, path: str) -> None:
    agent = spawn(d, 'skills = ["release-notes"]')
    out = say(d, agent, call("skill_execute", skill="release-notes", tool=path))
    assert out.startswith("tool said: error: ") and "secret outside" not in out and "root:" not in out, out


def test_doctor_reports_bad_front_matter(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    write_skill(home / "skills", "release-notes")
    for name, text in (("broken", "---\nname: Not A Valid Name\n---\nbody\n"), ("plain", "no front matter here\n")):
        (home / "skills" / name).mkdir()
        (home / "skills" / name / "SKILL.md").write_text(text)
    result = run_cli(home, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    # Every bad skill, in folder order, with each of its errors; the good one is not named.
    assert checks["skills"] == {"check": "skills", "status": "warn", "message":
        "broken: front matter 'name' must be 1-64 lowercase letters, digits and hyphens (not starting or ending "
        "with a hyphen); front matter 'description' must be a non-empty string; "
        "plain: SKILL.md must start with YAML front matter between '---' lines"}
    (home / "skills" / "broken" / "SKILL.md").unlink()
    (home / "skills" / "plain" / "SKILL.md").write_text("---\nname: plain\ndescription: Plain words\n---\nbody\n")
    result = run_cli(home, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    assert checks["skills"] == {"check": "skills", "status": "warn", "message": "broken: no SKILL.md in the folder"}
    (home / "skills" / "broken").rmdir()
    result = run_cli(home, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    assert checks["skills"] == {"check": "skills", "status": "ok", "message": "2 skill(s) valid"}


def test_dashboard_lists_skills_with_their_state(d: Daemon) -> None:
    r = d.get("/skills")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    page = r.text
    assert 'data-skill="release-notes"' in page and "Writes release notes" in page
    assert '<span class="pill bad">invalid</span>' in page and "front matter &#39;name&#39;" in page
    agent = spawn(d, 'skills = ["release-notes"]')
    page = d.get(f"/agents/{agent}").text
    assert '<dd id="agent-skills">release-notes (' in page
    assert ('<dt>Tools (skill)</dt><dd class="tools" data-origin="skill">skill_list, skill_describe, '
            'skill_execute</dd>') in page
    assert "skill_list" not in page.split('data-origin="built-in">')[1].split("</dd>")[0]
