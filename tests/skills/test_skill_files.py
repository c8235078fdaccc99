"""SKILL.md parsing and the folder rules, in process (the API and the tools are in test_skills.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.errors import BadRequest, NotFound
from agentd.skills import Skills, confined, load_skill, parse_skill_md, prompt_lines, read_file


@pytest.mark.parametrize("text, error", [
    ("no front matter\n", "must start with YAML front matter"),
    ("---\nname: x\ndescription: y\n", "not closed"),
    ("---\nname: [unclosed\n---\n", "not valid YAML"),
    ("---\n- a list\n---\n", "must be a mapping"),
    ("---\nname: Has Caps\ndescription: d\n---\n", "'name' must be"),
    ("---\nname: -edge\ndescription: d\n---\n", "'name' must be"),
    ("---\nname: ok\ndescription: '   '\n---\n", "'description' must be a non-empty string"),
    ("---\nname: install\ndescription: d\n---\n", "cannot be 'install' (reserved)"),
    ("---\nname: ok\ndescription: " + "x" * 1025 + "\n---\n", "longer than 1024"),
])
def test_bad_front_matter(text: str, error: str) -> None:
    _, _, errors = parse_skill_md(text)
    assert any(error in e for e in errors), errors


def test_good_front_matter_and_body() -> None:
    meta, body, errors = parse_skill_md("\ufeff---\nname: a-b\ndescription: Does b\nversion: 2\n---\n\nDo this.\n")
    assert errors == [] and meta == {"name": "a-b", "description": "Does b", "version": 2} and body == "Do this."


def test_folder_name_must_match(tmp_path: Path) -> None:
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: real\ndescription: d\n---\nbody\n")
    skill = load_skill(folder)
    assert skill.valid is False and skill.errors == ("front matter name 'real' does not match its folder 'other'",)
    assert skill.name == "other"
    assert load_skill(tmp_path).errors == ("no SKILL.md in the folder",)


def test_confinement(tmp_path: Path) -> None:
    root = tmp_path / "s"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("inside")
    (tmp_path / "secret").write_text("outside")
    (root / "link").symlink_to(tmp_path / "secret")
    assert confined(root, "sub/f.txt") == (root / "sub" / "f.txt").resolve()
    for bad in ("../secret", "/etc/passwd", "sub/../../secret", "link", "", ".", "sub\\..\\..\\secret", "a\x00b"):
        with pytest.raises(BadRequest):
            confined(root, bad)


def test_listing_permitted_and_prompt_lines(tmp_path: Path) -> None:
    for name in ("alpha", "beta"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name}\n  skill\n---\nB {name}\n")
    (tmp_path / ".installing-x").mkdir()  # a staging folder is not a skill
    skills = Skills(tmp_path)
    assert [s["name"] for s in skills.list()] == ["alpha", "beta"]
    assert [s.name for s in skills.permitted([])] == ["alpha", "beta"]
    assert [s.name for s in skills.permitted(["beta", "gamma"])] == ["beta"]
    assert prompt_lines(skills.permitted(["alpha"])).splitlines()[1:] == ["- alpha: The alpha skill"]
    with pytest.raises(NotFound):
        skills.get("gamma")
    with pytest.raises(NotFound):
        read_file(skills.get("alpha"), "missing.md")
    assert read_file(skills.get("alpha"), "SKILL.md").endswith("B alpha\n")
