"""In-process agent managers for the exact tests of agentd/agents/ (registry, sessions, runs, …).

A real `AgentManager` over the real agent services, wired as the kernel wires them, on a
real store (SQLite in a temp dir, or the PostgreSQL of AGENTD_TEST_PG via
`support.store_url_for`), the real catalog, approval queue and KV memory, and the fake LLM
server over real sockets. Nothing of the services is replaced: the collaborators the kernel
gives them (`record_usage`, `write_usage`, `audit`, `memory`, `cluster`) are recorders or
stand-ins here, so a test reads exactly what the services handed them.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agentd.agents.approvals import ApprovalQueue
from agentd.agents.loop import RunResult
from agentd.agents.manager import AgentManager
from agentd.agents.model_call import ModelCalls
from agentd.agents.registry import AgentRegistry
from agentd.agents.runqueue import RunQueues
from agentd.agents.run_request import CALLER, INLINE, WORKER, RunRequest
from agentd.agents.runs import Runs
from agentd.agents.session_store import SessionStore
from agentd.agents.uploads import Uploads
from agentd.config import parse_config
from agentd.llm.catalog import Catalog
from agentd.memory.kv import KvMemory
from agentd.store import open_store
from support import store_url_for

KEY = "sk-mgr"


def manifest(name: str, extra: str = "", provider: str = "openai", model: str = "gpt-4o") -> str:
    """A manifest on `provider`/`model`; `extra` is appended TOML (tables after the model table)."""
    return (f'name = "{name}"\ndescription = "agent {name}"\n'
            f'[model]\nprovider = "{provider}"\nmodel = "{model}"\n{extra}')


class Recorder:
    """Stands in for a kernel callback: records every call's arguments, returns `value`."""

    def __init__(self, value: Any = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.value = value

    def __call__(self, *args: Any) -> Any:
        self.calls.append(args)
        return self.value(*args) if callable(self.value) else self.value


class Env:
    """One store and what managers on it share; `manager()` builds another one on the same store."""

    def __init__(self, tmp_path: Path, config: dict[str, Any] | None = None) -> None:
        self.tmp_path = tmp_path
        self.store = open_store(tmp_path / "agentd.db", store_url_for(tmp_path))
        self.pool = ThreadPoolExecutor(2)
        self.config = parse_config(config or {}, tmp_path)
        self.catalog = Catalog.load()
        self.audit = Recorder()
        self.usage = Recorder()

    def manager(self, record_usage: Any = None, preflight: Any = None, write_usage: Any = None,
                memory: Any = None, cluster: Any = None, audit: Any = "recorder",
                approvals: Any = None, store: Any = None, key_budget: Any = None, **services: Any) -> AgentManager:
        """The agent services on this store (or `store`), wired as the kernel wires them;
        `services`: Runs' other collaborators (cooperation, skills, tool_services, a2a, cron, key_runs)."""
        approvals = approvals or ApprovalQueue()
        store = store or self.store
        models = ModelCalls(self.config, self.catalog, record_usage or self.usage)
        queues = RunQueues(self.pool, lambda: self.config.agents.max_queue, approvals, cluster,
                           shared=store.shared)
        registry = AgentRegistry(self.config, store, self.catalog, queues, memory,
                                 self.audit if audit == "recorder" else audit)
        sessions = SessionStore(store, registry, models, write_usage)
        uploads = Uploads(store)
        runs = Runs(self.config, self.catalog, registry, sessions, models, uploads, queues, approvals,
                    KvMemory(store), memory, cluster, preflight, key_budget=key_budget, **services)
        return AgentManager(registry, sessions, models, uploads, runs)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.store.close()


def run(m: AgentManager, handle: Any, text: str, attachments: list | None = None, emit: Any = None,
        options: Any = None, lock_timeout: float | None = None, cancel: threading.Event | None = None,
        **request: Any) -> RunResult:
    """One run on the calling thread, waiting for the agent's current run (at most `lock_timeout`)."""
    return m.runs.start(RunRequest(handle, text, attachments or [], options, emit,
                                   cancel or threading.Event(), on=INLINE, wait=lock_timeout,
                                   **request)).result()


def submit(m: AgentManager, handle: Any, text: str, attachments: list | None = None, emit: Any = None,
           options: Any = None, cancel: threading.Event | None = None) -> Any:
    """A run queued for a worker; its future."""
    return m.runs.start(RunRequest(handle, text, attachments or [], options, emit, cancel or threading.Event(),
                                   on=WORKER)).future


def run_on_caller(m: AgentManager, handle: Any, text: str, attachments: list | None = None, options: Any = None,
            cancel: threading.Event | None = None, disconnected: Any = None) -> RunResult:
    """A run on the calling thread when the agent is idle, else queued; its result."""
    return m.runs.start(RunRequest(handle, text, attachments or [], options, None, cancel or threading.Event(),
                                   on=CALLER)).result(disconnected)


def run_in_conversation(m: AgentManager, handle: Any, session_id: str, text: str, label: str = "") -> RunResult:
    """A run in another session of the agent (a channel conversation's)."""
    return m.runs.start(RunRequest(handle, text, on=INLINE, session_id=session_id, label=label)).result()


def llm_config(fake: Any, **llm: Any) -> dict[str, Any]:
    """Config (as parsed TOML) whose openai/anthropic/gemini URLs point at the fake LLM."""
    return {"llm": {"timeout_secs": 5, "retries": 0, **llm},
            "default_model": {"provider": "openai", "model": "gpt-4o", "api_key_env": "MGR_TEST_KEY"},
            "provider_urls": {"openai": fake.openai_base, "anthropic": fake.anthropic_base,
                              "gemini": fake.gemini_base}}


@pytest.fixture(scope="module")
def fake():
    """The fake LLM server (no key required), one per test module; import it as a fixture."""
    from fakellm import FakeLLM

    server = FakeLLM().start()
    yield server
    server.stop()


import pgtest  # noqa: E402 (ENABLED is set by conftest before test modules are imported)

# Tests of what a manager does on a database of its own (SQLite): under --db=postgres every
# in-process store is a shared one, where other daemons' rows are read back on purpose.
lone_store_only = pytest.mark.skipif(pgtest.ENABLED, reason="a lone daemon's store (SQLite); "
                                     "on a shared database other daemons' rows are adopted by design")
