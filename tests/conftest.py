"""Shared fixtures: real daemons in subprocesses, and an in-process app for middleware tests."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import support  # noqa: E402
from support import FAST_API, STARTED, Daemon, make_home, private_cache, take_daemon_hits  # noqa: E402
from support import stop_shared as _stop_shared  # noqa: E402
import pgtest  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--db", choices=("sqlite", "postgres"), default=None,
                     help="database backend of every daemon and store the suite starts "
                          "(postgres: a temp cluster via initdb/pg_ctl, or AGENTD_TEST_DATABASE_URL)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (setup.cfg) starts two workers per core: a test spends much of its time
    waiting on the processes it started (a daemon's boot and stop, a reply, a timeout the
    test is about), and a second worker per core runs meanwhile. PYTEST_XDIST_AUTO_NUM_WORKERS
    still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return 2 * len(os.sched_getaffinity(0))


def _cache_bytecode_outside_the_tree() -> None:
    """Let the daemons and CLI runs the suite starts keep compiled bytecode in a private
    temp folder when the environment forbids writing it beside the sources.

    Every one of those processes imports agentd afresh; without bytecode each compiles
    every module from source again. Mutation runs (scripts/mutation.py) ask for no
    bytecode on purpose and keep their environment as it is."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    if "MUTANT_UNDER_TEST" in os.environ or "mutmut" in sys.modules:
        return
    cache = private_cache("bytecode")
    if cache is not None:
        os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
        del os.environ["PYTHONDONTWRITEBYTECODE"]


MEMORY_FOLDER = Path("/dev/shm")


def _in_memory(folder: Path) -> bool:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[1:3] == [str(folder), "tmpfs"] for line in mounts)


def _temp_folders_in_memory(config: pytest.Config) -> None:
    """Make the tests' temporary folders (`tmp_path`: the daemons' homes with their SQLite
    databases and logs) in /dev/shm when it is a tmpfs this user may write with room to
    spare, unless `--basetemp` or PYTEST_DEBUG_TEMPROOT already chose a place.

    The suite creates and syncs thousands of small databases; on a disk other work shares,
    each sync waits behind that work. The folders stay pytest's own: numbered, only this
    user's, the last three runs kept."""
    if config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        return
    if not _in_memory(MEMORY_FOLDER) or not os.access(MEMORY_FOLDER, os.W_OK):
        return
    if shutil.disk_usage(MEMORY_FOLDER).free < 2 * 2**30:
        return
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(MEMORY_FOLDER)  # the workers xdist starts inherit it


def pytest_configure(config: pytest.Config) -> None:
    _cache_bytecode_outside_the_tree()
    support.FORK_DAEMONS = True
    _temp_folders_in_memory(config)
    backend = config.getoption("--db") or os.environ.get("AGENTD_TEST_DB", "").strip().lower()
    if backend == "postgres" or (not backend and os.environ.get("AGENTD_TEST_DATABASE_URL", "").strip()):
        pgtest.enable()
    config.addinivalue_line("markers", "daemon_may_crash(reason): the test makes a daemon exit non-zero "
                                       "or log a traceback on purpose (turns off the clean-stop check)")


@pytest.fixture(autouse=True)
def _daemons_stop_cleanly(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test when a daemon logged a Python traceback during it, or when a daemon
    the test started exited non-zero.

    Daemons started by the test itself are stopped (SIGTERM) first if still running;
    longer-lived (module) daemons have the log they wrote during this test checked, and
    their exit code is checked by their own fixture. Opt out per daemon with
    `Daemon.expect_crash(reason)` or per test with `@pytest.mark.daemon_may_crash(reason)`."""
    before = len(STARTED)
    for daemon in STARTED:
        daemon.new_log()  # what earlier tests left is theirs, not this test's
    yield
    if request.node.get_closest_marker("daemon_may_crash"):
        for daemon in STARTED[before:]:
            daemon.expect_crash("test marked daemon_may_crash")
    problems: list[str] = []
    for daemon in STARTED[before:]:
        problems += daemon.stop_and_check()
    for daemon in STARTED[:before]:
        problems += daemon.problems()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def _no_outage_outlives_its_test() -> Iterator[None]:
    """The database outage state is the process's (agentd/store/outage.py): one a test
    caused in process, and the lease grace after it, end with that test."""
    yield
    from agentd.store.outage import OUTAGE

    OUTAGE.__init__()  # type: ignore[misc]

def _feed_mutmut_stats() -> None:
    """mutmut's stats phase: count the functions the daemons ran as covered by this test."""
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state

    state()._stats.update(take_daemon_hits())


DAEMON_FIXTURES = {"agent_daemon", "shared_daemon", "daemon_factory", "guarded", "fresh"}


TESTS = Path(__file__).resolve().parent
# Parts of the suite (folders and files under tests/) whose outcome does not depend on the
# database: the adapters, drivers, HTTP server, CLI, MCP/A2A/skills and the repository checks
# make the same store calls the rest of the suite makes, so the PostgreSQL pass leaves them to
# the SQLite pass. So do the tools whose work is files, processes, the network and a browser,
# and the dashboard's scripts in a browser: the pages' server side runs on both backends in
# tests/api/pages/test_pages.py and its neighbours, the files a tool keeps in
# tests/agents/test_uploads.py.
BACKEND_FREE = {"channels", "llm", "server", "fakellm_selftest", "mcp", "a2a", "skills", "config", "cli",
                *(f"agents/tools/test_tool_{name}.py" for name in (
                    "base", "browser", "browser_proxy", "containers", "files", "media", "patch",
                    "processes", "shell", "web")),
                *(f"api/pages/test_{name}_browser.py" for name in (
                    "console", "dashboard", "manage", "schedules", "setup"))}


def _backend_free(path: Path) -> bool:
    """Whether `path`, a folder or a test file, is part of BACKEND_FREE (or a top-level test file)."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return False
    if len(parts) == 1 and path.is_file():
        return parts[0].startswith("test_")
    return any("/".join(parts[:depth]) in BACKEND_FREE for depth in range(1, len(parts) + 1))


def _names_paths(config: pytest.Config) -> bool:
    return any(not arg.startswith("-") and Path(arg.split("::")[0]).exists()
               for arg in config.invocation_params.args)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The PostgreSQL pass of the whole suite runs only the database-dependent part, and
    does not even import the rest (a file or folder named on the command line always runs)."""
    if pgtest.ENABLED and not _names_paths(config) and _backend_free(collection_path):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under mutmut (which runs with -x), in-process tests run before the daemon ones: most
    mutants are killed by a fast test, so the slow ones rarely have to start."""
    if os.environ.get("MUTANT_UNDER_TEST") in (None, "", "stats", "fail"):
        # A test given longer than the suite's timeout runs for minutes: first, so that it
        # never runs alone at the end (worksteal hands each worker a run of the collection
        # and an idle worker takes from the end of the others').
        items.sort(key=lambda item: not _outlasts_the_suite_timeout(item, config))
        return
    items.sort(key=lambda item: bool(DAEMON_FIXTURES & set(getattr(item, "fixturenames", ()))))


def _outlasts_the_suite_timeout(item: pytest.Item, config: pytest.Config) -> bool:
    mark = item.get_closest_marker("timeout")
    return mark is not None and bool(mark.args) and mark.args[0] > float(config.getini("timeout"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # tryfirst: before mutmut's own collector reads and clears its per-test set.
    _feed_mutmut_stats()


@pytest.fixture(scope="session", autouse=True)
def _every_daemon_checked() -> Iterator[None]:
    """Safety net for daemons kept by module fixtures of test files: at the end of the
    session each one is stopped and checked like the rest."""
    yield
    problems: list[str] = []
    for daemon in STARTED:
        problems += daemon.stop_and_check()
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Start daemons with a given config; all are stopped at the end of the test."""
    started: list[Daemon] = []

    def start(config_text: str | None = None, api_key: str = "", wait: bool = True,
              sub: str = "", **kwargs) -> Daemon:
        home = make_home(tmp_path / (sub or f"d{len(started)}"), config_text)
        daemon = Daemon(home, api_key=api_key, **kwargs)
        started.append(daemon)
        return daemon.start(wait=wait)

    yield start
    for daemon in started:
        try:
            daemon.stop()
        except RuntimeError:
            pass  # reported by _daemons_stop_cleanly


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon (no API key) shared by the read-mostly tests of a module."""
    home = make_home(tmp_path_factory.mktemp("shared"))
    daemon = Daemon(home).start()
    yield daemon
    _stop_shared(daemon)


@pytest.fixture(scope="session")
def fake_llm():
    """A real fake-LLM HTTP server on 127.0.0.1 for the whole test session."""
    from fakellm import FakeLLM

    server = FakeLLM().start()
    yield server
    server.stop()


def llm_config(fake, extra: str = "") -> str:
    """Config pointing every driver family at the fake LLM."""
    return (FAST_API + "\n[llm]\ntimeout_secs = 3\nretries = 1\n"
            "\n[default_model]\nprovider = \"openai\"\nmodel = \"gpt-4o\"\napi_key_env = \"OPENAI_API_KEY\"\n"
            f"\n[provider_urls]\nopenai = \"{fake.openai_base}\"\nanthropic = \"{fake.anthropic_base}\"\n"
            f"gemini = \"{fake.gemini_base}\"\ndeepseek = \"{fake.openai_base}\"\n" + extra)


# Added to the config of a daemon whose tests are about neither memory nor the default
# configuration: it remembers no exchange, so it never loads the embedding model for one.
NO_REMEMBERING = "\n[memory]\nauto_remember = false\n"


LLM_ENV = {"OPENAI_API_KEY": "test-openai", "ANTHROPIC_API_KEY": "test-anthropic",
           "GEMINI_API_KEY": "test-gemini", "DEEPSEEK_API_KEY": "test-deepseek"}


@pytest.fixture(scope="module")
def agent_daemon(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    """A daemon whose providers all point at the fake LLM (shared by a module)."""
    home = make_home(tmp_path_factory.mktemp("agents"), llm_config(fake_llm))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    yield daemon
    _stop_shared(daemon)
