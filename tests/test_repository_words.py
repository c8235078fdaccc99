"""The repository speaks of the product: no work-tracking labels (a numbered stop or issue,
"this stop") in code, comments, tests, scripts, docs or packaging files. A measurement belongs
in docs/performance.md with its command, a reason in a comment.

One test per area, so a failure names the area and lists every hit in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

THIS_FILE = Path(__file__).resolve()   # its samples are labels on purpose
ROOT = THIS_FILE.parent.parent

# Word-bounded, any case: "stop 27", "Stops 26-28", "issue #14", "issue 16's", "this stop".
LABEL = re.compile(r"\b(?:stop|issue)s?\s*#?\s*\d+\b|\bthis\s+stop\b", re.IGNORECASE)

TEXT_SUFFIXES = {".py", ".md", ".cfg", ".toml", ".txt", ".yml", ".yaml", ".json", ".conf", ".service",
                 ".html", ".css", ".js", ".sh", ".ini", ""}
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".mutation", "mutants", "site", "node_modules"}

AREAS = {
    "agentd": ["agentd"],
    "tests": ["tests"],
    "scripts": ["scripts"],
    "docs": ["docs", "README.md", "CHANGELOG.md", "mkdocs.yml"],
    "packaging": ["setup.cfg", "setup.py", "requirements.txt", ".ci"],
}


def files_of(area: str) -> list[Path]:
    found: list[Path] = []
    for name in AREAS[area]:
        path = ROOT / name
        if path.is_file():
            found.append(path)
            continue
        for item in sorted(path.rglob("*")):
            if (item.is_file() and item.suffix in TEXT_SUFFIXES
                    and not SKIPPED_DIRS.intersection(item.relative_to(ROOT).parts)
                    and item != THIS_FILE):
                found.append(item)
    return found


def label_hits(paths: list[Path]) -> list[str]:
    """`path:line: text` for every label in `paths`."""
    hits = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if LABEL.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:160]}")
    return hits


@pytest.mark.parametrize("area", sorted(AREAS))
def test_the_repository_speaks_of_the_product(area: str) -> None:
    paths = files_of(area)
    assert paths, f"nothing to scan in {AREAS[area]}"
    hits = label_hits(paths)
    assert hits == [], f"{len(hits)} work-tracking labels in {area}:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", ["see stop 27", "Stops 26 and 27", "(issue 14)", "issue #16", "Issue 9's",
                                  "as this stop measured", "THIS STOP", "stop 3:"])
def test_labels_are_found(text: str) -> None:
    assert LABEL.search(text), text


@pytest.mark.parametrize("text", ["stop the run", "a non-stop stream", "issues", "tissue 4",
                                  "bus stop", "stopped 3 runs", "the issue tracker", "nonstop 5",
                                  "POST /api/agents/{id}/stop", "stop_reason 2"])
def test_product_words_pass(text: str) -> None:
    assert not LABEL.search(text), text


def test_commit_subjects_since_this_check_speak_of_the_product() -> None:
    """Every commit that came after this file (merged branches included) has a subject
    without a work-tracking label."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=True, timeout=60).stdout

    added = git("log", "--diff-filter=A", "--format=%H", "--", str(THIS_FILE.relative_to(ROOT))).split()[-1]
    # `added..HEAD` and `added` itself: a shallow clone has no parent of its oldest commit.
    subjects = (git("log", "--format=%h %s", f"{added}..HEAD") + git("log", "-1", "--format=%h %s", added)).splitlines()
    assert subjects
    assert [line for line in subjects if LABEL.search(line.partition(" ")[2])] == []
