"""Mutation testing must exercise code reached only through the daemon.

mutmut runs the tests with the working directory set to its `mutants/` copy and names the
active mutant in MUTANT_UNDER_TEST. These tests break one function on purpose in such a
copy and check that a daemon started by the test support really runs the broken copy, and
that during mutmut's stats phase the daemon reports the mutated functions it ran.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import requests

from support import Daemon, make_home, take_daemon_hits

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def broken_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `mutants/`-like copy of the package whose health check is deliberately broken."""
    copy = tmp_path / "mutants"
    shutil.copytree(ROOT / "agentd", copy / "agentd", ignore=shutil.ignore_patterns("__pycache__"))
    for assets in ("static", "templates"):
        shutil.copytree(ROOT / assets, copy / assets)
    routes = copy / "agentd" / "api" / "routes_system.py"
    text = routes.read_text()
    assert '"status": "ok"' in text
    routes.write_text(text.replace('"status": "ok"', '"status": "deliberately-broken"', 1))
    monkeypatch.chdir(copy)
    return copy


def test_daemon_runs_the_mutated_copy(broken_copy: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MUTANT_UNDER_TEST", "agentd.api.routes_system.x_nothing__mutmut_1")
    d = Daemon(make_home(tmp_path / "home")).start()
    try:
        body = requests.get(f"{d.url}/api/health", timeout=10).json()
        assert body["status"] == "deliberately-broken", \
            "the daemon under mutation testing ran the installed package, not the mutated copy"
    finally:
        assert d.stop() == 0


def test_without_mutmut_the_daemon_runs_the_checkout(broken_copy: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    d = Daemon(make_home(tmp_path / "home"))
    # Outside mutmut the daemon runs `python -m agentd` from the current directory as well,
    # so the copy is what runs here too; the launcher only differs in reporting hits.
    d.start()
    try:
        assert requests.get(f"{d.url}/api/health", timeout=10).json()["status"] == "deliberately-broken"
        assert not d.hits_path.exists()
    finally:
        assert d.stop() == 0


def test_stats_phase_reports_the_daemons_function_hits(broken_copy: Path, tmp_path: Path, monkeypatch) -> None:
    """A trampolined function (as mutmut generates them) run by the daemon is reported."""
    pytest.importorskip("mutmut")
    init = broken_copy / "agentd" / "api" / "routes_system.py"
    # The shape mutmut gives a mutated function: a trampoline that records a stats hit.
    init.write_text(init.read_text() + '''

from mutmut.mutation.trampoline import wrap_in_trampoline as _mutmut_mutated


def x_probe__mutmut_orig() -> str:
    return "probe"


@_mutmut_mutated({"_mutmut_orig": x_probe__mutmut_orig})
def probe() -> str:
    return x_probe__mutmut_orig()


@bp.get("/api/_probe")
def probe_route():
    return {"probe": probe()}
''')
    monkeypatch.setenv("MUTANT_UNDER_TEST", "stats")
    d = Daemon(make_home(tmp_path / "home")).start()
    try:
        take_daemon_hits()   # whatever start-up ran
        assert requests.get(f"{d.url}/api/_probe", timeout=10).json() == {"probe": "probe"}
        hits = take_daemon_hits()
        assert "agentd.api.routes_system.x_probe" in hits, hits
        assert requests.get(f"{d.url}/api/_probe", timeout=10).ok
        assert "agentd.api.routes_system.x_probe" in take_daemon_hits(), "a hit is reported again in a later test"
    finally:
        monkeypatch.delenv("MUTANT_UNDER_TEST")
        assert d.stop() == 0
        os.environ.pop("AGENTD_MUTMUT_HITS", None)



def test_stats_phase_reports_the_hits_of_a_tests_own_script(broken_copy: Path, tmp_path: Path, monkeypatch) -> None:
    """A test's `python -c` script started through the support runs the copy and reports its hits."""
    pytest.importorskip("mutmut")
    import subprocess

    from support import agentd_command, agentd_env

    init = broken_copy / "agentd" / "health_probe.py"
    init.write_text('''
from mutmut.mutation.trampoline import wrap_in_trampoline as _mutmut_mutated


def x_probe__mutmut_orig() -> str:
    return "probe"


@_mutmut_mutated({"_mutmut_orig": x_probe__mutmut_orig})
def probe() -> str:
    return x_probe__mutmut_orig()
''')
    monkeypatch.setenv("MUTANT_UNDER_TEST", "stats")
    take_daemon_hits()
    env = agentd_env(make_home(tmp_path / "home"))
    script = "from agentd.health_probe import probe\nprint(probe())"
    done = subprocess.run(agentd_command(["-c", script], env), env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "probe\n"), done.stderr
    assert take_daemon_hits() == {"agentd.health_probe.x_probe"}


PARENT = """
import json, subprocess, sys, time
env = json.loads(sys.argv[1])
child = subprocess.Popen([sys.executable, sys.argv[2], "start"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_daemon_ends_when_the_test_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """mutmut SIGKILLs a test past its time limit (no teardown): the launcher stops its daemon."""
    import json
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from support import agentd_env, free_port

    port = free_port()
    env = agentd_env(make_home(tmp_path / "home"), port)
    parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(env), str(ROOT / "tests" / "mutmut_daemon.py")],
                              stdout=subprocess.PIPE, text=True)
    daemon_pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/api/health", timeout=2).ok:
                break
        except requests.RequestException:
            time.sleep(0.2)
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)

    def gone() -> bool:
        try:
            return psutil.Process(daemon_pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not gone():
        time.sleep(0.2)
    if not gone():
        os.kill(daemon_pid, signal.SIGKILL)
        pytest.fail("the daemon outlived the killed test process that started it")


def test_the_scratch_copy_holds_what_any_test_file_reads(tmp_path: Path, monkeypatch) -> None:
    """A module without a mapped test selection runs the whole suite, whose tests/test_docs.py
    imports scripts/docs_hooks.py and reads the docs, README and .ci/run beside the tests."""
    import configparser
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    mutation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mutation)
    monkeypatch.setattr(mutation, "SCRATCH", tmp_path)
    assert "agentd/ids.py" in mutation.TESTS
    work = mutation.prepare("agentd/not_mapped.py", mutation.ALL_TESTS, fresh=True)
    assert work == tmp_path / "agentd_not_mapped"
    for name in ("scripts/docs_hooks.py", "docs/testing.md", "README.md", "CHANGELOG.md", "mkdocs.yml",
                 ".ci/run", "requirements.txt", "static", "templates", "agentd/__init__.py", "tests/support.py"):
        assert (work / name).exists(), name
    cfg = configparser.ConfigParser()
    cfg.read(work / "setup.cfg")
    section = cfg["mutmut"]
    assert section["only_mutate"].split() == ["agentd/not_mapped.py"]
    assert section["pytest_add_cli_args_test_selection"].split() == mutation.ALL_TESTS
    # mutmut copies the tests itself; all else must be named for its mutants/ copy.
    assert set(section["also_copy"].split()) == {"static", "templates", "scripts", "docs", ".ci", "README.md",
                                                 "CHANGELOG.md", "mkdocs.yml", "requirements.txt", "setup.py"}
