"""The documentation: the site builds in strict mode, it names every config key the code
accepts and every route the app serves, and every example in the README and docs/ runs
against a real daemon on the fake LLM.

Each fenced block in the README and docs/ follows a marker comment saying how it is checked:

    <!-- example: run expect="text" -->   run (sh or python); the output must contain the text
    <!-- example: config -->              parsed as config.toml
    <!-- example: manifest -->            spawned as an agent
    <!-- example: file NAME -->           written as NAME for the blocks after it
    <!-- example: not run: WHY -->        shown only, with the reason
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
MARKER = re.compile(r"^<!-- example: (.*?) -->$")
DEFAULT_ADDRESSES = ("localhost:4200", "127.0.0.1:4200")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


# -- the examples --------------------------------------------------------------------------

@dataclass
class Example:
    document: Path
    line: int
    language: str
    marker: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        for kind in ("not run", "run", "config", "manifest", "file"):
            if self.marker == kind or self.marker.startswith(kind + " ") or self.marker.startswith(kind + ":"):
                return kind
        return ""

    @property
    def expect(self) -> str:
        found = re.search(r'expect="([^"]*)"', self.marker)
        return found.group(1) if found else ""


def examples(document: Path) -> list[Example]:
    """Every fenced block of `document`, with the marker line above it ("" when none)."""
    found: list[Example] = []
    lines = document.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            end = index + 1
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            marker = MARKER.match(lines[index - 1]) if index else None
            found.append(Example(document, index + 1, line[3:].strip(), marker.group(1) if marker else "",
                                 "\n".join(lines[index + 1:end]) + "\n"))
            index = end
        index += 1
    return found


def test_every_block_says_how_it_is_checked() -> None:
    problems = []
    for document in DOCUMENTS:
        for example in examples(document):
            if not example.kind:
                problems.append(f"{example.where}: no `<!-- example: ... -->` marker above the block")
            elif example.kind == "not run" and not example.marker.partition(":")[2].strip():
                problems.append(f"{example.where}: `not run` needs a reason")
            elif example.kind == "run" and (example.language not in ("sh", "python") or not example.expect):
                problems.append(f"{example.where}: a run example is sh or python and names what it expects")
    assert problems == []


def test_the_quick_start_commands_are_the_ones_ci_runs() -> None:
    quick = next(e for e in examples(ROOT / "README.md") if "pip install -e ." in e.code)
    assert quick.code == ("pip install -e . && agentd start\n"
                          "pip install -e '.[test]' && python -m pytest && python -m pytest --db=postgres\n")
    ci = (ROOT / ".ci" / "run").read_text().rstrip().splitlines()
    assert ci[-1] == quick.code.splitlines()[1]


def test_every_command_of_the_cli_is_run_by_an_example() -> None:
    """Each command `agentd --help` lists runs, as written, in an example against the test
    daemon; `start` is how every example daemon is started."""
    commands = re.search(r"\{([a-z,]+)\}", _cli_help()).group(1).split(",")
    run = "\n".join(e.code for d in DOCUMENTS for e in examples(d) if e.kind == "run")
    assert [c for c in commands if c != "start" and not re.search(rf"^agentd {c}\b", run, re.M)] == []


def _runs_a_daemon(document: Path) -> bool:
    return any(e.kind in ("run", "manifest") for e in examples(document))


def _local(code: str, port: int) -> str:
    for address in DEFAULT_ADDRESSES:
        code = code.replace(address, f"127.0.0.1:{port}")
    return code


def _check_config(example: Example, tmp_path: Path) -> None:
    from agentd.channels.catalog import ChannelCatalog, validate
    from agentd.config import parse_config, unknown_keys

    data = tomllib.loads(example.code)
    parse_config(data, tmp_path)
    assert unknown_keys(data) == [], f"{example.where}: keys agentd does not read"
    catalog = ChannelCatalog.load()
    for name, section in (data.get("channels") or {}).items():
        if isinstance(section, dict):
            validate(catalog.get(name), section)


def _run(example: Example, daemon: Daemon | None, workdir: Path, shims: Path) -> None:
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"}
    if daemon is not None:
        env.update({"AGENTD_HOME": str(daemon.home), "AGENTD_LISTEN": f"127.0.0.1:{daemon.port}"})
    code = _local(example.code, daemon.port) if daemon is not None else example.code
    command = ["bash", "-e", "-o", "pipefail", "-c", code] if example.language == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{example.where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert example.expect in done.stdout, f"{example.where}: {example.expect!r} not in its output:\n{done.stdout}"


CHECKED = ("run", "config", "manifest", "file")


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if any(e.kind in CHECKED for e in examples(d))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_examples_run(document: Path, tmp_path: Path, fake_llm) -> None:
    found = [e for e in examples(document) if e.kind in CHECKED]
    shims = tmp_path / "bin"
    shims.mkdir()
    shim = shims / "agentd"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m agentd "$@"\n')
    shim.chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    daemon = None
    if _runs_a_daemon(document):
        daemon = Daemon(make_home(tmp_path, llm_config(fake_llm)), env_extra=LLM_ENV).start()
    try:
        for example in found:
            if example.kind == "config":
                _check_config(example, tmp_path)
            elif example.kind == "file":
                (workdir / example.marker.split(" ", 1)[1].strip()).write_text(example.code)
            elif example.kind == "manifest":
                answer = daemon.post("/api/agents", json={"manifest_toml": example.code})
                assert answer.status_code == 201, f"{example.where}: {answer.text}"
                assert answer.json()["warnings"] == [], f"{example.where}: {answer.text}"
            else:
                _run(example, daemon, workdir, shims)
    finally:
        if daemon is not None:
            daemon.stop()


# -- what the docs must name -----------------------------------------------------------------

def _docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in DOCUMENTS)


def _validated_keys() -> set[str]:
    """Keys named by the config parsers' error messages (`config key api.threads: ...`)."""
    keys = set()
    for path in (ROOT / "agentd").rglob("*.py"):
        keys |= set(re.findall(r"config key ([a-z_]+(?:\.[a-z_]+)*)\b(?![.{])", path.read_text(encoding="utf-8")))
    return keys - {"or"}


def test_every_config_key_the_code_accepts_is_in_the_reference() -> None:
    table = hooks.config_table()
    documented = {key for key, *_ in hooks.config_keys()}
    validated = _validated_keys()
    assert len(validated) > 10
    missing = sorted(k for k in set(hooks.schema_keys()) | validated
                     if k not in documented and k not in {"api", "cluster", "llm", "memory", "tools", "agents"})
    assert missing == []
    for key in documented:
        table_name, _, name = key.rpartition(".")
        assert (f"[{table_name}] {name}" if table_name else f"`{key}`") in table or name == "<adapter>"


def test_every_agentd_variable_the_code_reads_is_in_the_environment_table() -> None:
    read = set()
    for path in (ROOT / "agentd").rglob("*.py"):
        read |= set(re.findall(r"\"(AGENTD_[A-Z_]+)\"", path.read_text(encoding="utf-8")))
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\| `(AGENTD_[A-Z_]+)` \|", page, re.M))
    assert len(read) > 5 and read == table


def test_every_variable_the_code_reads_by_name_is_in_the_docs() -> None:
    """Beyond agentd's own: the standard variables it honours (a CA bundle, OpenTelemetry)
    are named on a page; a variable the code sets itself is not a setting."""
    read, set_here = set(), set()
    for path in (ROOT / "agentd").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        read |= set(re.findall(r"os\.(?:environ\.get\(|environ\[|getenv\()\"([A-Z][A-Z0-9_]+)\"", text))
        set_here |= set(re.findall(r"os\.environ\[\"([A-Z][A-Z0-9_]+)\"\] =", text))
    text = _docs_text()
    assert len(read) > 10
    assert sorted(name for name in read - set_here if not re.search(rf"`{name}[`=]", text)) == []


def test_no_documented_key_is_called_unknown() -> None:
    """The start and `agentd doctor` warn about keys agentd does not read: never about one
    the reference lists."""
    from agentd.config import unknown_keys

    called = []
    for key, *_ in hooks.config_keys():
        table_name, _, name = key.rpartition(".")
        name = {"<provider>": "openai", "<adapter>": "telegram"}.get(name, name)
        value = {} if name == "telegram" else 1
        if unknown_keys({table_name: {name: value}} if table_name else {name: value}):
            called.append(key)
    assert called == []
    assert unknown_keys({"api": {"threds": 4}, "log_levl": "debug", "channels": {"wrkers": 2, "telegram": {}}}) == [
        "api.threds", "log_levl", "channels.wrkers"]


def test_every_documented_key_is_read_and_checked_by_the_code(tmp_path: Path) -> None:
    """Each key of the reference with a plain value: its default is accepted, and a value of
    the wrong kind is refused naming the key (so the reference names real keys)."""
    from agentd.config import ConfigError, parse_config

    cluster_settings = hooks.cluster_module().cluster_settings

    checked = 0
    for key, (kind, default) in hooks.schema_keys().items():
        if "<" in key or default is None or default is hooks.dataclasses.MISSING:
            continue
        table_name, _, name = key.rpartition(".")
        good = {table_name: {name: default}} if table_name else {key: default}
        bad = {table_name: {name: {"not": "this"}}} if table_name else {key: {"not": "this"}}
        parse = cluster_settings if table_name == "cluster" else parse_config
        args = ("127.0.0.1:4200",) if table_name == "cluster" else (tmp_path,)
        parse(good, *args)
        with pytest.raises(ConfigError) as refused:
            parse(bad, *args)
        assert key in str(refused.value) or (key == "api_listen" and "api_listen" in str(refused.value)), key
        checked += 1
    assert checked >= 40


STATED_RANGE = re.compile(r"\((?:[^()]*?[ ;(])?(-?\d+(?:\.\d+)?)(?:-| to )(-?\d+(?:\.\d+)?)[;)]")
STATED_LOW = re.compile(r"\((?:[^()]*?[ ;(])?(at least|greater than) (-?\d+(?:\.\d+)?)[;)]")


def _parse_key(key: str, value: Any, home: Path) -> None:
    """Parse a config holding `key` = `value` alone, as the start does."""
    from agentd.config import parse_config

    table_name, _, name = key.rpartition(".")
    data = {table_name: {name: value}} if table_name else {name: value}
    if table_name == "cluster":
        hooks.cluster_module().cluster_settings(data, "127.0.0.1:4200")
    else:
        parse_config(data, home)


def _refused(key: str, value: Any, home: Path) -> bool:
    from agentd.config import ConfigError

    try:
        _parse_key(key, value, home)
    except ConfigError as refused:
        assert key in str(refused), key
        return True
    return False


def test_every_range_the_reference_states_is_the_one_the_code_keeps(tmp_path: Path) -> None:
    """A key described with a range, "(1-1024)", takes both ends and is refused one step past
    either, naming the key."""
    checked = []
    for key, kind, _, meaning in hooks.config_keys():
        stated = STATED_RANGE.search(meaning)
        if stated is None:
            continue
        number = float if kind == "number" else int
        low, high = number(stated.group(1)), number(stated.group(2))
        step = 0.001 if kind == "number" else 1
        assert not _refused(key, low, tmp_path) and not _refused(key, high, tmp_path), key
        assert _refused(key, low - step, tmp_path) and _refused(key, high + step, tmp_path), key
        checked.append(key)
    assert len(checked) >= 15 and "channels.workers" in checked


def test_every_bound_the_code_keeps_is_stated_in_the_reference(tmp_path: Path) -> None:
    """A number key the code refuses some value for (below zero, zero, a billion) states its
    bounds: "(1-20)" (checked above), "(at least 1)" or "(greater than 0)", and a stated
    lower bound is the one the code keeps."""
    unstated, checked = [], 0
    for key, kind, _, meaning in hooks.config_keys():
        if kind not in ("integer", "number") or "<" in key or STATED_RANGE.search(meaning):
            continue
        low = STATED_LOW.search(meaning)
        if low is None:
            if any(_refused(key, value, tmp_path) for value in (-1, 0, 10**9)):
                unstated.append(key)
            continue
        bound = (float if kind == "number" else int)(low.group(2))
        step = 0.001 if kind == "number" else 1
        at_least = low.group(1) == "at least"
        assert _refused(key, bound - step if at_least else bound, tmp_path), key
        assert not _refused(key, bound if at_least else bound + step, tmp_path), key
        if _refused(key, 10**9, tmp_path):
            unstated.append(key)
        checked += 1
    assert unstated == []
    assert checked >= 20


def _shape(path: str) -> str:
    return re.sub(r"<[^>]*>|\{[^}]*\}", "{}", path)


def test_every_route_the_app_serves_is_in_the_docs() -> None:
    from agentd.api.apidoc import is_api_path
    from agentd.api.openapi import openapi_path

    document, rules = hooks.served_app_facts()
    reference = hooks.api_reference(document)
    text = _shape(_docs_text())
    missing = []
    for rule, methods in rules:
        for method in methods:
            if is_api_path(rule):
                if f"`{method} {openapi_path(rule)}`" not in reference:
                    missing.append(f"{method} {rule} (API reference)")
            elif rule == "/":
                if "| `/` |" not in text:
                    missing.append(f"{method} / (dashboard)")
            elif _shape(rule) not in text:
                missing.append(f"{method} {rule}")
    assert missing == []
    assert len(rules) > 100


def test_every_route_the_docs_name_is_served_with_that_method() -> None:
    """`GET /api/...` in prose and `| GET | `/api/...` |` rows name a route and method the app
    serves (the channel pages are left out: they also quote the platforms' own APIs)."""
    _, rules = hooks.served_app_facts()
    served: dict[str, set[str]] = {}
    for rule, methods in rules:
        served.setdefault(_shape(rule), set()).update(methods)
    verbs = "GET|POST|PUT|PATCH|DELETE"
    wrong, checked = [], 0
    for document in DOCUMENTS:
        if "channels" in document.parts:
            continue
        text = document.read_text(encoding="utf-8")
        # A route named as refusing a method ("`GET /mcp` answers 405") is not a claim it serves it.
        named = re.findall(rf"`({verbs}) (/(?:api|v1|mcp|a2a)\b[^`\s?]*)(?=[`\s?])(?!`\s+answers 405)", text)
        for row in re.finditer(rf"^\| *((?:{verbs})(?: *[/,] *(?:{verbs}))*) *\| *`(/[^`?]*)", text, re.M):
            named += [(verb, row.group(2)) for verb in re.split(r"[ /,]+", row.group(1))]
        checked += len(named)
        for verb, path in named:
            for variant in {re.sub(r"\[[^\]]*\]", "", path), re.sub(r"[\[\]]", "", path)}:
                shape = _shape(re.sub(r"\$[A-Z_]+", "{}", variant))
                if verb not in served.get(shape, set()):
                    wrong.append(f"{document.name}: {verb} {variant}")
    assert wrong == []
    assert checked > 150


def test_every_path_of_the_served_openapi_is_described_by_a_page() -> None:
    """The generated reference lists every route; a reader also finds each one explained on
    docs/http-api.md or its topic page."""
    document, _ = hooks.served_app_facts()
    text = _shape(_docs_text().replace("$ID", "{}"))
    assert len(document["paths"]) > 80

    def named(path: str) -> bool:
        # A parameter may be written as a placeholder or as a real value (`whatsapp` for {name}).
        pattern = r"[a-z0-9_.-]+|\{\}".join(re.escape(part) for part in _shape(path).split("{}"))
        return re.search(rf"{pattern}(?![\w/{{])", text) is not None

    assert [path for path in document["paths"] if not named(path)] == []


# -- the site ----------------------------------------------------------------------------------

def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    for name in ("index.html", "api-reference.html", "configuration.html", "changelog.html", "architecture.html"):
        assert name in pages
    assert {f"channels/{c['name']}.html" for c in hooks.channel_catalogue()} <= pages
    configuration = (site / "configuration.html").read_text(encoding="utf-8")
    assert "rate_limit_per_second" in configuration and "lease_secs" in configuration


def test_a_key_without_a_description_fails_the_build(monkeypatch) -> None:
    texts = dict(hooks._key_texts())
    texts["keys"] = {k: v for k, v in texts["keys"].items() if k != "api.threads"}
    monkeypatch.setattr(hooks, "_key_texts", lambda: texts)
    with pytest.raises(hooks.DocsError, match="api.threads"):
        hooks.config_keys()


def test_the_docs_extra_is_in_the_test_extra() -> None:
    import configparser

    extras = configparser.ConfigParser()
    extras.read(ROOT / "setup.cfg")
    section = extras["options.extras_require"]
    docs = set(section["docs"].split())
    assert docs and docs <= set(section["test"].split())


def test_requirements_pin_exactly_the_runtime_dependencies() -> None:
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    runtime = [line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()]
    pinned = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert pinned == runtime
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[0-9][A-Za-z0-9.]*", line) for line in pinned)


def test_every_adapter_page_has_its_notes_and_a_valid_template(tmp_path: Path) -> None:
    from agentd.channels.catalog import ChannelCatalog, validate

    catalog = ChannelCatalog.load()
    names = [entry["name"] for entry in hooks.channel_catalogue()]
    assert sorted(hooks.adapter_notes()) == sorted(names) and len(names) == 40
    for entry in hooks.channel_catalogue():
        page = hooks.channel_page(entry)
        assert "## How it works" in page and "**Status" in page, entry["name"]
        section = tomllib.loads(entry["config_template"])["channels"][entry["name"]]
        validate(catalog.get(entry["name"]), section)
        assert all(f"`{key}`" in page for key in entry["keys"]), entry["name"]


def _cli_help(*words: str) -> str:
    """What `agentd WORDS --help` prints in a 200-column terminal (the console script's own
    entry point, in process: one interpreter start for the dozens of pages read)."""
    from agentd.cli import main

    out = io.StringIO()
    # argparse takes the width from COLUMNS; argh's deprecation notes (for its developers) are
    # hidden as in the console script.
    with mock.patch.dict(os.environ, COLUMNS="200"), warnings.catch_warnings(), \
            contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        warnings.simplefilter("ignore", DeprecationWarning)
        main([*words, "--help"])
    assert done.value.code in (0, None), out.getvalue()
    return out.getvalue()


def test_every_command_and_option_of_the_cli_is_documented() -> None:
    text = "\n".join((ROOT / "docs" / name).read_text(encoding="utf-8") for name in ("cli.md", "workflows.md"))
    missing = []
    top = _cli_help()
    commands = re.search(r"\{([a-z,]+)\}", top).group(1).split(",")
    assert "start" in commands and "workflow" in commands and "cron" in commands
    # Each command, groups included, is listed with a line saying what it does.
    assert [c for c in commands if not re.search(rf"^    {c} +[A-Z]", top, re.M)] == []
    for command in commands:
        subcommands = [[command]]
        if command in ("workflow", "cron"):
            subcommands = [[command, sub] for sub in re.search(r"\{([a-z,]+)\}", _cli_help(command)).group(1).split(",")]
        for words in subcommands:
            if f"agentd {' '.join(words)}" not in text and not (
                    len(words) == 2 and re.search(rf"agentd {words[0]} [a-z|\\]*\b{words[1]}\b", text)):
                missing.append(" ".join(words))
            for line in _cli_help(*words).splitlines():
                names = re.findall(r"(--[a-z][a-z-]*)", line) if line.lstrip().startswith("-") else []
                # An option documented under any of its names (argh adds the long spellings).
                if names and "--help" not in names and not any(re.search(rf"{n}\b", text) for n in names):
                    missing.append(f"{' '.join(words)} {names[-1]}")
    assert missing == []


def test_the_readme_is_short_and_every_link_and_image_it_names_exists() -> None:
    """A screen or two for a user: what agentd is, the quick start, a first agent, the
    screenshot and links into the docs; the site checks its own links, not the README's."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    assert re.findall(r"^## (.+)$", readme, re.M)[:3] == ["Quick start", "A first agent", "Documentation"]
    targets = re.findall(r"\]\(([^)#\s]+)", readme)
    assert "docs/img/dashboard.png" in targets and len(targets) > 20
    assert [t for t in targets if "://" not in t and not (ROOT / t).is_file()] == []


# -- the pages that describe the code ----------------------------------------------------------

def _fenced_after(page: str, heading: str) -> str:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    section = text[text.index(heading):]
    return section.split("```", 2)[1]


HISTORY = re.compile(r"\bcode before\b|\bbefore and after\b|\bbefore\b[^.|]{0,60}\bafter\b|\bused to\b"
                     r"|\bno longer\b|\bwent from\b|\bearlier runs?\b|\bnow checks\b", re.I)


def test_the_performance_page_gives_current_figures_only() -> None:
    """Each figure is today's, with the command that reproduces it: no table or sentence
    compares the code before a change with the code after it (the changelog tells changes)."""
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    hits = [f"{number}: {line[:100]}" for number, line in enumerate(page.splitlines(), 1) if HISTORY.search(line)]
    lines = page.splitlines()
    for number, (line, rule) in enumerate(zip(lines, lines[1:]), 1):
        if rule.startswith("|---") and any(re.match(r"(?:[\w ]+ )?(?:before|after|now)(?:$|[,:]| \()", cell.strip())
                                           for cell in line.split("|")):
            hits.append(f"{number}: {line[:100]}")
    assert hits == []


def test_the_architecture_layout_names_every_package_and_module_and_only_those() -> None:
    """The layout on docs/architecture.md names each package and top-level module of agentd/
    (a comma list after a path shares its folder), and every path it names exists."""
    layout = _fenced_after("architecture.md", "## Layout")
    named: set[str] = set()
    for path, more in re.findall(r"(agentd/[\w/]*\w(?:\.py|/))((?:, \w+\.py)*)", layout):
        folder = path.rpartition("/")[0] if path.endswith(".py") else path.rstrip("/")
        named |= {path.rstrip("/")} | {f"{folder}/{name}" for name in re.findall(r"\w+\.py", more)}
    assert [path for path in sorted(named) if not (ROOT / path).exists()] == []
    present = {f"agentd/{p.name}" for p in (ROOT / "agentd").iterdir()
               if (p.is_dir() and (p / "__init__.py").exists())
               or (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))}
    assert sorted(present - named) == []


def test_every_runtime_dependency_is_in_the_installation_table() -> None:
    """docs/installation.md lists every pinned dependency with why it is there."""
    page = (ROOT / "docs" / "installation.md").read_text(encoding="utf-8")
    table = page[page.index("## Dependencies"):]
    rows = " ".join(re.findall(r"^\| ([^|]+) \|", table, re.M)).lower()
    pinned = [line.split("==")[0] for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert [name for name in pinned if not re.search(rf"(?<![\w-]){re.escape(name.lower())}(?![\w-])", rows)] == []


def test_every_function_the_message_walks_name_exists() -> None:
    """The walks of docs/architecture.md ("Following a message") name `package/module.Name`,
    `module.Class.method` and `Class.method` steps: each is in the code, so a rename that
    leaves them stale fails."""
    import importlib

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    walks = text[text.index("## Following a message"):text.index("## The stack")]
    modules: dict[str, list[str]] = {}   # a module's last name or a class's name -> modules
    for path in (ROOT / "agentd").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules.setdefault(module.rpartition(".")[2], []).append(module)
        for name in re.findall(r"^class (\w+)", path.read_text(encoding="utf-8"), re.M):
            modules.setdefault(name, []).append(module)
    missing, checked = [], 0
    for ref in re.findall(r"`((?:[a-z_]+/)*[A-Za-z_]+\.[A-Za-z_]\w*(?:\.\w+)?)`", walks):
        if ref.endswith(".py") or re.match(r"(channel|chat)\.", ref):
            continue   # a file, or an audit record's or a response's type
        head, _, attrs = ref.partition(".")
        if "/" in head:
            candidates = ["agentd." + head.replace("/", ".")]
        else:
            candidates = modules.get(head, [])
            attrs = ref if head[0].isupper() else attrs
        checked += 1
        if not any(_has(importlib.import_module(name), attrs) for name in candidates):
            missing.append(ref)
    assert missing == []
    assert checked >= 30


def _has(obj: Any, attrs: str) -> bool:
    """`obj` has the callable `attrs` (dotted), or its class sets that attribute in `__init__`."""
    import inspect

    for attr in attrs.split("."):
        owner, obj = obj, getattr(obj, attr, None)
    if obj is None and inspect.isclass(owner):
        return re.search(rf"self\.{attr}\b *(?::[^=]*)?= ", inspect.getsource(owner)) is not None
    return callable(obj)


def test_the_test_folders_mirror_the_packages() -> None:
    """As docs/testing.md says: each folder holding tests is the folder of a package of
    agentd/ (the fake LLM's own tests apart)."""
    folders = {p.parent.relative_to(ROOT / "tests") for p in (ROOT / "tests").rglob("test_*.py")}
    assert len(folders) > 10
    assert sorted(str(f) for f in folders - {Path("."), Path("fakellm_selftest")}
                  if not (ROOT / "agentd" / f / "__init__.py").is_file()) == []
