"""The agent manager's assembly (agentd/agents/manager.py): its starting state, the queue
bound it reads from the config, and queued runs carrying every field of the request."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from agentd.agents import manager as manager_module
from agentd.agents.handle import COMPACT_KEEP, RunOptions
from agentd.agents.ops import AgentOpsImpl
from agentd.errors import TooManyRequests
from mgrsupport import Env, llm_config, manifest, submit, fake  # noqa: F401 (fake: a fixture)
from support import put_session


@pytest.fixture()
def env(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, {**llm_config(fake), "agents": {"max_queue": 1}})
    yield e
    e.close()


def test_starting_state(env) -> None:
    pre, usage, written, memory, cluster = object(), object(), object(), object(), object()
    m = env.manager(record_usage=usage, preflight=pre, write_usage=written, memory=memory, cluster=cluster)
    registry, sessions, models, uploads, runs = m.registry, m.sessions, m.models, m.uploads, m.runs
    assert (sessions.registry, runs.registry, runs.sessions, runs.models, runs.uploads, sessions.models) == \
        (registry, registry, sessions, models, uploads, models), "BUG: the services are not the ones composed"
    assert (m.store, registry.store, sessions.store, uploads.store) == (env.store,) * 4
    assert (registry.config, models.config, runs.config, registry.catalog, models.catalog, runs.catalog) == \
        (env.config,) * 3 + (env.catalog,) * 3
    assert (models.record_usage, sessions.write_usage, runs.checks.preflight, runs.memory, registry.memory) == \
        (usage, written, pre, memory, memory)
    assert (runs.cluster, runs.queues.cluster, registry.queues, runs.queues.executor) == \
        (cluster, cluster, runs.queues, env.pool)
    assert registry.audit is env.audit and runs.approvals is runs.queues.approvals
    assert (registry._agents, registry._by_name, registry._killing, models.url_overrides) == ({}, {}, set(), {})
    assert m.url_overrides is models.url_overrides
    bare = env.manager(audit=None)
    assert (bare.runs.checks.preflight, bare.runs.memory, bare.runs.cluster, bare.sessions.write_usage,
            bare.registry.audit) == (None,) * 5
    assert isinstance(registry._lock, type(threading.RLock()))
    with registry._lock, registry._lock:   # re-entrant: spawn registers while holding it
        pass
    ops = runs.ops_for(None)
    assert isinstance(ops, AgentOpsImpl) and (ops.registry, ops.runs, ops.kv, ops.memory) == \
        (registry, runs, runs.kv, memory) and runs.ops_for(None) is not ops


def test_re_exports() -> None:
    assert sorted(manager_module.__all__) == sorted(
        ["AgentHandle", "AgentManager", "AgentOpsImpl", "AgentRunError", "CAPABILITY_TOOLS", "COMPACT_KEEP",
         "MESSAGE_LIMIT", "MODES", "RunOptions", "STOPPED_NOTE", "UPLOAD_LIMIT", "UPLOAD_TYPES", "parse_uuid",
         "run_error"])
    for name in manager_module.__all__:
        assert getattr(manager_module, name) is not None


def test_the_queue_bound_comes_from_the_config_and_follows_it(env) -> None:
    m = env.manager()
    h = m.spawn(manifest("q"))
    h.run_lock.acquire()
    try:
        running = submit(m, h, "first")
        time.sleep(0.2)
        waiting = submit(m, h, "second")
        with pytest.raises(TooManyRequests) as err:
            submit(m, h, "third")
        assert "(max_queue 1)" in err.value.message
        env.config.agents.max_queue = 2
        extra = submit(m, h, "third")
    finally:
        h.run_lock.release()
    assert [f.result(10).response for f in (running, waiting, extra)] == ["echo: first", "echo: second", "echo: third"]


def test_a_queued_run_carries_every_field(env) -> None:
    m = env.manager()
    h = m.spawn(manifest("fields"))
    png = m.save_upload(h, "p.png", "image/png", b"\x89PNG")
    events: list = []
    cancel = threading.Event()
    future = submit(m, h, "[[echo_params]]", [{"file_id": png["file_id"]}], events.append,
                      RunOptions(max_tokens=55, extra_system="XS"), cancel)
    import json

    got = json.loads(future.result(10).response)
    assert (got["n_images"], got["max_tokens"], got["system"]) == (1, 55, "You are a helpful AI agent.\n\nXS")
    assert "text_delta" in [e.type for e in events], "the queued run streams to the request's sink"
    h.run_lock.acquire()
    try:
        first = submit(m, h, "[[slow:5]]", cancel=cancel)
        time.sleep(0.2)
    finally:
        h.run_lock.release()
    cancel.set()
    from agentd.agents.loop import RunCancelled

    with pytest.raises(RunCancelled):
        first.result(10)


def test_compact_acts_on_the_session_named(env) -> None:
    m = env.manager()
    h = m.spawn(manifest("compacting"))
    other = str(uuid.uuid4())
    m.sessions.ensure(h, other, "user:ann")
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(COMPACT_KEEP + 2)]
    for session_id in (h.session_id, other):
        put_session(env.store, session_id, turns)
    assert m.compact(h, other)["summarized_messages"] == 2
    assert m.session(h, other)["message_count"] == COMPACT_KEEP + 1
    assert m.session(h)["message_count"] == COMPACT_KEEP + 2, "BUG: the agent's own session was compacted"
    assert m.compact(h)["summarized_messages"] == 2
