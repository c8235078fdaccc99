"""Agents on a database other daemons write too (agentd/agents/shared.py), in process.

Two real `AgentManager`s on one real store stand for two daemons: what one spawns,
re-modes, resets or kills, the other adopts, refreshes or forgets when `shared.sync_agent`
/ `shared.sync_all` run (the manager calls them on every lookup when the store is
PostgreSQL; tests/cluster/test_cluster.py drives that through real daemons). Values are checked
exactly: the adopted handle's fields, what is forgotten and what is kept, the log lines.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pony import orm

from agentd.agents import shared
from agentd.agents.approvals import ApprovalQueue
from agentd.agents.manager import AgentManager
from agentd.agents.model_call import ModelCalls
from agentd.agents.registry import AgentRegistry
from agentd.agents.runqueue import RunQueues
from agentd.agents.runs import Runs
from agentd.agents.session_store import SessionStore
from agentd.agents.uploads import Uploads
from agentd.config import parse_config
from agentd.llm.catalog import Catalog
from agentd.memory.kv import KvMemory
from agentd.store import open_store
from support import store_url_for


def manifest(name: str, model: str = "gpt-4o") -> str:
    return f'name = "{name}"\ndescription = "agent {name}"\n[model]\nprovider = "openai"\nmodel = "{model}"\n'


@pytest.fixture()
def pair(tmp_path: Path):
    store = open_store(tmp_path / "agentd.db", store_url_for(tmp_path))
    pool = ThreadPoolExecutor(2)
    config = parse_config({}, tmp_path)
    catalog = Catalog.load()

    def manager() -> AgentManager:
        approvals = ApprovalQueue()
        models = ModelCalls(config, catalog, lambda *a: None)
        queues = RunQueues(pool, lambda: config.agents.max_queue, approvals, shared=store.shared)
        registry = AgentRegistry(config, store, catalog, queues)
        sessions = SessionStore(store, registry, models)
        uploads = Uploads(store)
        runs = Runs(config, catalog, registry, sessions, models, uploads, queues, approvals, KvMemory(store))
        return AgentManager(registry, sessions, models, uploads, runs)

    yield manager(), manager(), store
    pool.shutdown(wait=False)
    store.close()


def test_an_agent_spawned_elsewhere_is_adopted_by_id_with_its_fields(pair, caplog) -> None:
    a, b, _ = pair
    caplog.set_level(logging.INFO, logger="agentd.agents")
    h = a.spawn(manifest("alpha"))
    # (b.find() would sync by itself on a shared store: look at b's memory directly.)
    assert b.registry._agents.get(h.id) is None, "without a sync the other daemon does not know it yet"
    shared.sync_agent(b.registry, agent_id=h.id)
    got = b.registry._agents[h.id]
    assert (got.id, got.name, got.mode, got.session_id, got.provider, got.model, got.state, got.killed) == \
        (h.id, "alpha", "Auto", h.session_id, "openai", "gpt-4o", "Running", False)
    assert got.created_at == h.created_at and got.created_at.utcoffset().total_seconds() == 0, \
        "BUG: an adopted agent's creation time is not UTC"
    assert got.last_active == h.last_active and got.last_active.tzinfo is not None
    assert b.registry._by_name == {"alpha": h.id}
    assert [r.getMessage() for r in caplog.records if "adopted" in r.getMessage()] == \
        [f"agent alpha ({h.id}) adopted from the shared database"]


def test_an_agent_spawned_elsewhere_is_adopted_by_name(pair) -> None:
    a, b, _ = pair
    h = a.spawn(manifest("beta"))
    shared.sync_agent(b.registry, name="beta")
    assert b.registry._by_name == {"beta": h.id} and b.registry._agents[h.id].name == "beta"
    shared.sync_agent(b.registry, name="nobody")   # no row, no handle: nothing happens
    assert list(b.registry._agents) == [h.id]


def test_mode_and_session_taken_over_caches_dropped_only_on_a_new_session(pair) -> None:
    a, b, store = pair
    h = a.spawn(manifest("gamma"))
    shared.sync_agent(b.registry, agent_id=h.id)
    mine = b.registry._agents[h.id]
    mine.session_tail = [{"role": "user"}]
    a.set_mode(h, "Observe")
    shared.sync_agent(b.registry, agent_id=h.id)
    assert b.registry._agents[h.id] is mine and mine.mode == "Observe", "BUG: a mode set on another daemon is ignored"
    assert mine.session_tail == [{"role": "user"}], \
        "BUG: the session cache was dropped though the session did not change"
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).session_id = "new-session"
    shared.sync_agent(b.registry, name="gamma")
    assert mine.session_id == "new-session" and mine.session_tail is None, \
        "BUG: a session reset on another daemon keeps the old history here"


def test_the_key_an_agent_acts_as_follows_its_row(pair) -> None:
    """A key that spawned or re-manifested the agent on another daemon is the one its
    manifest work acts as here too; the admin's again once the row names none."""
    a, b, store = pair
    h = a.spawn(manifest("kappa"), key_id="k-spawn")
    shared.sync_agent(b.registry, agent_id=h.id)
    mine = b.registry._agents[h.id]
    assert mine.key_id == "k-spawn"
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).key_id = "k-other"
    shared.sync_agent(b.registry, agent_id=h.id)
    assert b.registry._agents[h.id] is mine and mine.key_id == "k-other"
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).key_id = None
    shared.sync_agent(b.registry, agent_id=h.id)
    assert mine.key_id == ""


def test_a_manifest_saved_elsewhere_is_taken_over(pair, caplog) -> None:
    a, b, store = pair
    h = a.spawn(manifest("epsilon"))
    shared.sync_agent(b.registry, agent_id=h.id)
    mine = b.registry._agents[h.id]
    assert a.set_model(h, "deepseek/deepseek-chat") == [
        "provider deepseek has no API key: set DEEPSEEK_API_KEY or POST /api/providers/deepseek/key"]
    shared.sync_agent(b.registry, agent_id=h.id)
    assert b.registry._agents[h.id] is mine
    assert (mine.provider, mine.model) == ("deepseek", "deepseek-chat")
    assert mine.manifest.toml_text == h.manifest.toml_text.strip()
    parsed = mine.manifest
    shared.sync_agent(b.registry, agent_id=h.id)
    assert mine.manifest is parsed, "an unchanged manifest is not parsed again"
    assert mine.manifest.data["description"] == "agent epsilon"
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).manifest_toml = "name = "
    with caplog.at_level(logging.ERROR, logger="agentd.agents"):
        shared.sync_agent(b.registry, agent_id=h.id)
    assert b.registry._agents[h.id] is mine and mine.manifest is parsed and mine.model == "deepseek-chat", \
        "an unreadable manifest leaves the handle as it was"
    refusal = (f"agent epsilon ({h.id}): the manifest saved elsewhere cannot be read: "
               "invalid manifest format: TOML syntax error: Invalid value (at end of document)")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [refusal]
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="agentd.agents"):
        shared.sync_agent(b.registry, agent_id=h.id)
        shared.sync_agent(b.registry, agent_id=h.id)
    assert caplog.records == [], "the same unreadable manifest is logged once, not at every lookup"
    assert mine.manifest is parsed
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).manifest_toml = manifest("epsilon", "gpt-4o-mini")
    shared.sync_agent(b.registry, agent_id=h.id)
    assert mine.model == "gpt-4o-mini"
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).manifest_toml = "name = "
    with caplog.at_level(logging.ERROR, logger="agentd.agents"):
        shared.sync_agent(b.registry, agent_id=h.id)
    assert [r.getMessage() for r in caplog.records] == [refusal], \
        "saved again after a readable one, it is refused and logged again"


def test_a_manifest_saved_elsewhere_is_read_by_the_rules_of_a_stored_agent(pair, caplog) -> None:
    """A daemon from before grants had to be arrays may still save `tools = "file_read"`
    (a one-item list then): this daemon takes it over as it loads such an agent at start."""
    a, b, store = pair
    h = a.spawn(manifest("lambda"))
    shared.sync_agent(b.registry, agent_id=h.id)
    mine = b.registry._agents[h.id]
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).manifest_toml = manifest("lambda", "gpt-4o-mini") + \
            '[capabilities]\ntools = "file_read"\n'
    caplog.set_level(logging.ERROR, logger="agentd.agents")
    shared.sync_agent(b.registry, agent_id=h.id)
    assert [r.getMessage() for r in caplog.records] == []
    assert (mine.model, mine.manifest.capabilities["tools"]) == ("gpt-4o-mini", ["file_read"])


def test_an_agent_killed_elsewhere_is_forgotten(pair, caplog) -> None:
    a, b, _ = pair
    caplog.set_level(logging.INFO, logger="agentd.agents")
    h = a.spawn(manifest("delta"))
    keep = a.spawn(manifest("keep"))
    shared.sync_agent(b.registry, agent_id=h.id)
    shared.sync_agent(b.registry, agent_id=keep.id)
    mine = b.registry._agents[h.id]
    waiting = b.runs.approvals.request(h.id, "delta", "file_write", {})
    other = b.runs.approvals.request(keep.id, "keep", "file_write", {})
    a.kill(a.get(h.id))
    shared.sync_agent(b.registry, agent_id=h.id)
    assert (mine.killed, mine.state) == (True, "Terminated"), "BUG: an agent killed elsewhere still runs here"
    assert h.id not in b.registry._agents and b.registry._by_name == {"keep": keep.id}
    assert (waiting.decision, other.decision) == ("cancelled", None), "BUG: the killed agent's approvals still wait"
    assert f"agent delta ({h.id}) was killed through another daemon" in [r.getMessage() for r in caplog.records]
    shared.sync_agent(b.registry, agent_id=h.id)   # forgetting twice is harmless
    assert list(b.registry._agents) == [keep.id]


def test_an_agent_being_killed_here_is_not_adopted_back_from_its_row(pair) -> None:
    a, _, _ = pair
    h = a.spawn(manifest("theta"))
    stop = a.runs.queues.stop
    seen: list[bool] = []

    def stop_then_look_up(handle):  # a lookup that lands after the handle went, before the row does
        for sync in (lambda: shared.sync_agent(a.registry, agent_id=handle.id),
                     lambda: shared.sync_agent(a.registry, name="theta"), lambda: shared.sync_all(a.registry)):
            sync()
            seen.append(handle.id in a.registry._agents or "theta" in a.registry._by_name)
        return stop(handle)

    a.runs.queues.stop = stop_then_look_up
    a.kill(h)
    assert seen == [False, False, False], "BUG: an agent being killed was adopted back from its row"
    assert a.registry._agents == {} and a.registry._by_name == {} and a.registry._killing == set()
    with orm.db_session:
        assert a.store.e.AgentRow.get(id=h.id) is None
    again = a.spawn(manifest("theta"))  # the name is free, and a new agent of it is adopted as usual
    a.registry._agents.clear()
    a.registry._by_name.clear()
    shared.sync_agent(a.registry, name="theta")
    assert list(a.registry._agents) == [again.id]


def test_a_kill_that_starts_while_the_handle_is_built_wins(pair) -> None:
    a, b, _ = pair
    h = a.spawn(manifest("kappa"))
    build = b.registry.handle_from_row

    def kill_starts(row):  # b begins killing the agent while its own lookup builds the handle
        handle = build(row)
        b.registry._killing.add(row.id)
        return handle

    b.registry.handle_from_row = kill_starts
    shared.sync_agent(b.registry, agent_id=h.id)
    assert b.registry._agents == {} and b.registry._by_name == {}, \
        "BUG: a handle was registered for an agent being killed"


def test_a_row_deleted_while_it_is_adopted_is_read_whole(pair) -> None:
    a, b, _ = pair
    h = a.spawn(manifest("iota"))
    build = b.registry.handle_from_row
    built: list[str] = []

    def delete_first(row):  # the agent is killed through `a` just as `b` reads its row
        worker = threading.Thread(target=a.kill, args=(a.get(h.id),))
        worker.start()
        worker.join(10)
        handle = build(row)  # its manifest was read with the row: no second SELECT to fail
        built.append(handle.name)
        return handle

    b.registry.handle_from_row = delete_first
    shared.sync_agent(b.registry, agent_id=h.id)
    assert built == ["iota"]
    shared.sync_agent(b.registry, agent_id=h.id)  # the next look finds no row and forgets it
    assert b.registry._agents == {} and b.registry._by_name == {}


def test_an_agent_killed_elsewhere_is_forgotten_by_name(pair) -> None:
    a, b, _ = pair
    h = a.spawn(manifest("eps"))
    shared.sync_agent(b.registry, name="eps")
    a.kill(a.get(h.id))
    shared.sync_agent(b.registry, name="eps")
    assert b.registry._agents == {} and b.registry._by_name == {}


def test_a_name_killed_and_spawned_again_elsewhere_is_the_new_agent(pair) -> None:
    a, b, _ = pair
    old = a.spawn(manifest("zeta"))
    shared.sync_agent(b.registry, name="zeta")
    stale = b.registry._agents[old.id]
    a.kill(a.get(old.id))
    new = a.spawn(manifest("zeta", model="gpt-4o-mini"))
    shared.sync_agent(b.registry, name="zeta")
    assert stale.killed and old.id not in b.registry._agents, "BUG: the old agent of a reused name lives on"
    assert b.registry._by_name == {"zeta": new.id} and b.registry._agents[new.id].model == "gpt-4o-mini"


def test_an_unreadable_manifest_is_logged_and_not_adopted(pair, caplog) -> None:
    a, b, store = pair
    h = a.spawn(manifest("eta"))
    with orm.db_session:
        store.e.AgentRow.get(id=h.id).manifest_toml = "this is = = not toml"
    caplog.set_level(logging.INFO, logger="agentd.agents")
    shared.sync_agent(b.registry, agent_id=h.id)
    assert b.registry._agents == {}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].getMessage().startswith(
        f"agent eta ({h.id}) has an unreadable manifest: invalid manifest format"), [r.getMessage() for r in errors]


def test_sync_all_makes_the_set_of_agents_match_the_table(pair) -> None:
    a, b, _ = pair
    gone = a.spawn(manifest("gone"))
    known = a.spawn(manifest("known"))
    shared.sync_all(b.registry)
    assert sorted(b.registry._by_name) == ["gone", "known"]
    mine_gone, mine_known = b.registry._agents[gone.id], b.registry._agents[known.id]
    a.kill(a.get(gone.id))
    a.set_mode(a.get(known.id), "Manual")
    fresh = a.spawn(manifest("fresh"))
    shared.sync_all(b.registry)
    assert sorted(b.registry._by_name) == ["fresh", "known"], "BUG: the agent list differs between daemons"
    assert mine_gone.killed and b.registry._agents[known.id] is mine_known and mine_known.mode == "Manual"
    assert mine_known.session_id == known.session_id, "BUG: a refresh lost the agent's session"
    assert b.registry._agents[fresh.id].session_id == fresh.session_id
    assert [x.name for x in b.handles()] == ["known", "fresh"]


def test_refresh_of_a_vanished_handle_is_a_no_op() -> None:
    assert shared._refresh(None, "Auto", "s") is None


def test_loading_skips_an_unreadable_manifest_and_keeps_the_others(pair, caplog) -> None:
    """The start-up load (registry.load) and adoption share handle_from_row: one bad row is
    logged and skipped, every other agent comes back with its stored id, mode and times."""
    a, b, store = pair
    good, bad = a.spawn(manifest("theta")), a.spawn(manifest("iota"))
    with orm.db_session:
        store.e.AgentRow.get(id=bad.id).manifest_toml = "this is = = not toml"
    caplog.set_level(logging.INFO, logger="agentd.agents")
    assert b.load() == 1
    assert list(b.registry._agents) == [good.id] and b.registry._by_name == {"theta": good.id}
    back = b.registry._agents[good.id]
    assert (back.mode, back.session_id, back.created_at, back.last_active) == \
        (good.mode, good.session_id, good.created_at, good.last_active)
    assert back.created_at.utcoffset().total_seconds() == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"agent iota ({bad.id}) has an unreadable manifest"), errors
