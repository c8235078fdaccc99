"""The agent manager's assembly (agentd/agents/manager.py): its starting state, the queue
bound it reads from the config, and queued runs carrying every field of the request."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agentd.agents import manager as manager_module
from agentd.agents.handle import RunOptions
from agentd.agents.ops import AgentOpsImpl
from agentd.errors import TooManyRequests
from mgrsupport import Env, llm_config, manifest, fake  # noqa: F401 (fake: a fixture)


@pytest.fixture()
def env(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, {**llm_config(fake), "agents": {"max_queue": 1}})
    yield e
    e.close()


def test_starting_state(env) -> None:
    pre = object()
    m = manager_module.AgentManager(env.config, env.store, env.catalog, "kv", "approvals", env.pool, env.usage,
                                    preflight=pre)
    assert (m.config, m.store, m.catalog, m.kv, m.approvals, m.executor, m.record_usage, m.preflight) == \
        (env.config, env.store, env.catalog, "kv", "approvals", env.pool, env.usage, pre)
    assert (m._agents, m._by_name, m.memory, m.url_overrides, m.audit_hook, m.write_usage, m.cluster) == \
        ({}, {}, None, {}, None, None, None)
    assert manager_module.AgentManager(env.config, env.store, env.catalog, None, None, env.pool,
                                       env.usage).preflight is None
    assert isinstance(m._lock, type(threading.RLock()))
    with m._lock, m._lock:   # re-entrant: spawn registers while holding it
        pass
    ops = m.ops_for(None)
    assert isinstance(ops, AgentOpsImpl) and ops.m is m and m.ops_for(None) is not ops


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
        running = m.submit(h, "first")
        time.sleep(0.2)
        waiting = m.submit(h, "second")
        with pytest.raises(TooManyRequests) as err:
            m.submit(h, "third")
        assert "(max_queue 1)" in err.value.message
        env.config.agents.max_queue = 2
        extra = m.submit(h, "third")
    finally:
        h.run_lock.release()
    assert [f.result(10).response for f in (running, waiting, extra)] == ["echo: first", "echo: second", "echo: third"]


def test_a_queued_run_carries_every_field(env) -> None:
    m = env.manager()
    h = m.spawn(manifest("fields"))
    png = m.save_upload(h, "p.png", "image/png", b"\x89PNG")
    events: list = []
    cancel = threading.Event()
    future = m.submit(h, "[[echo_params]]", [{"file_id": png["file_id"]}], events.append,
                      RunOptions(max_tokens=55, extra_system="XS"), cancel)
    import json

    got = json.loads(future.result(10).response)
    assert (got["n_images"], got["max_tokens"], got["system"]) == (1, 55, "You are a helpful AI agent.\n\nXS")
    assert "text_delta" in [e.type for e in events], "the queued run streams to the request's sink"
    h.run_lock.acquire()
    try:
        first = m.submit(h, "[[slow:5]]", cancel=cancel)
        time.sleep(0.2)
    finally:
        h.run_lock.release()
    cancel.set()
    from agentd.agents.loop import RunCancelled

    with pytest.raises(RunCancelled):
        first.result(10)
