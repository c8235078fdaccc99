"""The agent registry (agentd/agents/registry.py), in process, with exact values.

Real managers on a real store (tests/mgrsupport.py): spawn, load, lookups by id and name
with near-miss references, model resolution (defaults, prefixes, aliases), key status,
the list/detail/summary shapes, the tools a profile, a list or a mode grants, re-moding
and kill (everything the agent owned is gone, nothing of another agent is touched).
"""

from __future__ import annotations

import logging
import uuid
from datetime import timezone
from pathlib import Path

import pytest
from pony import orm

from agentd.errors import BadRequest, Conflict, Forbidden, NotFound
from mgrsupport import Env, manifest, lone_store_only


@pytest.fixture()
def env(tmp_path: Path):
    e = Env(tmp_path)
    yield e
    e.close()


@pytest.fixture()
def mgr(env):
    return env.manager()


def row_of(env, agent_id: str):
    with orm.db_session:
        row = env.store.e.AgentRow.get(id=agent_id)
        return None if row is None else {"name": row.name, "mode": row.mode, "state": row.state,
                                         "session_id": row.session_id, "manifest_toml": row.manifest_toml,
                                         "created_at": row.created_at, "last_active": row.last_active}


# -- spawn -------------------------------------------------------------------------------
def test_spawn_persists_registers_logs_and_audits(env, mgr, caplog) -> None:
    caplog.set_level(logging.INFO, logger="agentd.agents")
    text = manifest("alpha", '[identity]\nemojj = "x"\n')
    h = mgr.spawn(text)
    assert str(uuid.UUID(h.id)) == h.id and str(uuid.UUID(h.session_id)) == h.session_id and h.id != h.session_id
    assert (h.name, h.mode, h.state, h.provider, h.model, h.api_key_env, h.base_url, h.killed) == \
        ("alpha", "Auto", "Running", "openai", "gpt-4o", "", "", False)
    assert h.created_at == h.last_active and h.created_at.tzinfo is not None
    row = row_of(env, h.id)
    assert row == {"name": "alpha", "mode": "Auto", "state": "Running", "session_id": h.session_id,
                   "manifest_toml": text.strip(), "created_at": row["created_at"], "last_active": row["created_at"]}
    assert row["created_at"].replace(tzinfo=timezone.utc) == h.created_at
    with orm.db_session:
        session = env.store.e.SessionRow.get(id=h.session_id)
        assert session.agent.id == h.id and session.items.count() == 0
    assert mgr.registry._agents == {h.id: h} and mgr.registry._by_name == {"alpha": h.id}
    assert mgr.registry.count() == 1
    messages = [r.getMessage() for r in caplog.records if r.name == "agentd.agents"]
    assert messages == [f"spawned agent alpha ({h.id}) on openai/gpt-4o",
                        "agent alpha manifest: unknown key 'identity.emojj' ignored (did you mean 'identity.emoji'?)"]
    assert [r.levelname for r in caplog.records if r.name == "agentd.agents"] == ["INFO", "WARNING"]
    assert env.audit.calls == [("agent.spawn", "alpha", {"agent_id": h.id})]


def test_spawn_without_audit_hook_still_spawns(env) -> None:
    m = env.manager(audit=None)
    h = m.spawn(manifest("quiet"))
    assert m.get(h.id) is h and env.audit.calls == []


@pytest.mark.parametrize("text", [None, "", "   \n\t "])
def test_spawn_without_manifest_is_refused(mgr, text) -> None:
    with pytest.raises(BadRequest) as err:
        mgr.spawn(text)
    assert err.value.message == "manifest_toml is required"
    assert mgr.registry.count() == 0


@lone_store_only
def test_spawn_of_a_taken_name_is_a_conflict_and_changes_nothing(env, mgr) -> None:
    h = mgr.spawn(manifest("dup"))
    with pytest.raises(Conflict) as err:
        mgr.spawn(manifest("dup", model="gpt-4o-mini"))
    assert err.value.message == "an agent named 'dup' already exists"
    assert mgr.registry._agents == {h.id: h} and env.audit.calls == [("agent.spawn", "dup", {"agent_id": h.id})]
    # Another daemon on the same (non-shared) database: the unique name in the store refuses it.
    other = env.manager()
    with pytest.raises(Conflict) as err:
        other.spawn(manifest("dup"))
    assert err.value.message == "an agent named 'dup' already exists"
    assert other.registry._agents == {} and other.registry._by_name == {}, "BUG: a refused spawn is registered anyway"
    with orm.db_session:
        assert orm.count(r for r in env.store.e.AgentRow) == 1
        assert orm.count(s for s in env.store.e.SessionRow) == 1


def test_unknown_provider_needs_a_base_url(mgr) -> None:
    with pytest.raises(BadRequest) as err:
        mgr.spawn(manifest("x", provider="nosuch", model="m1"))
    assert err.value.message == ("invalid manifest format: model.provider: unknown provider 'nosuch' "
                                 "(set model.base_url for a custom endpoint)")
    assert mgr.registry.count() == 0
    h = mgr.spawn(manifest("x", 'base_url = "http://127.0.0.1:9/v1"\n', provider="nosuch", model="m1"))
    assert (h.provider, h.model, h.base_url) == ("nosuch", "m1", "http://127.0.0.1:9/v1")


def test_a_signed_manifest_spawns_and_a_bad_signature_is_audited(env, mgr) -> None:
    from nacl.signing import SigningKey

    from agentd.agents.signing import sign_manifest

    text = manifest("signed")
    envelope = sign_manifest(text, SigningKey.generate(), "me")
    h = mgr.spawn(None, envelope)
    assert h.name == "signed" and row_of(env, h.id)["manifest_toml"] == text.strip()
    with pytest.raises(Forbidden) as err:
        mgr.spawn(manifest("other"), envelope)
    assert err.value.message == "manifest signature verification failed: signed manifest does not match manifest_toml"
    assert env.audit.calls[-1] == ("agent.signature_rejected", "",
                                   {"error": "manifest signature verification failed: "
                                             "signed manifest does not match manifest_toml"})
    long_garbage = "x" * 500
    with pytest.raises(Forbidden):
        mgr.spawn(None, long_garbage)
    assert env.audit.calls[-1] == ("agent.signature_rejected", "",
                                   {"error": "manifest signature verification failed: signed_manifest is not valid JSON"})
    quiet = env.manager(audit=None)
    before = len(env.audit.calls)
    with pytest.raises(Forbidden):
        quiet.spawn(None, long_garbage)
    assert quiet.registry.count() == 0 and len(env.audit.calls) == before


def test_signature_error_text_is_cut_at_200_chars(env, mgr) -> None:
    import hashlib
    import json

    text = manifest("cut")
    envelope = json.dumps({"manifest": text, "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                           "signature": [0] * 64, "signer_public_key": "zz" * 200})
    with pytest.raises(Forbidden) as err:
        mgr.spawn(None, envelope)
    assert err.value.message == "manifest signature verification failed: signer_public_key is not hex"
    assert env.audit.calls[-1][2] == {"error": err.value.message[:200]}
    env.audit.calls.clear()
    bad = json.dumps({"manifest": text, "content_hash": "0" * 64})
    with pytest.raises(Forbidden):
        mgr.spawn(None, bad)
    assert env.audit.calls == [("agent.signature_rejected", "",
                                {"error": "manifest signature verification failed: content hash mismatch"})]


# -- model resolution ----------------------------------------------------------------------
@pytest.mark.parametrize("model_table, expected", [
    # provider/model "default" (or empty) take the [default_model] values, key and URL included
    ('provider = "default"\nmodel = "default"\n', ("anthropic", "claude-sonnet-4-20250514", "ANTHROPIC_API_KEY", "")),
    ('provider = ""\nmodel = ""\n', ("anthropic", "claude-sonnet-4-20250514", "ANTHROPIC_API_KEY", "")),
    ('provider = "openai"\nmodel = "default"\n', ("openai", "claude-sonnet-4-20250514", "ANTHROPIC_API_KEY", "")),
    # a catalog model without a provider is its own provider's, not the default's (gpt-4o is OpenAI's)
    ('provider = "default"\nmodel = "gpt-4o"\n', ("openai", "gpt-4o", "", "")),
    ('provider = ""\nmodel = "gpt4o"\n', ("openai", "gpt-4o", "", "")),
    ('provider = "default"\nmodel = "sonnet"\n', ("anthropic", "claude-sonnet-4-6", "ANTHROPIC_API_KEY", "")),
    ('provider = "default"\nmodel = "my-own-model"\n', ("anthropic", "my-own-model", "ANTHROPIC_API_KEY", "")),
    ('provider = "openai"\nmodel = ""\n', ("openai", "claude-sonnet-4-20250514", "ANTHROPIC_API_KEY", "")),
    ('provider = "default"\nmodel = "gpt-4o"\napi_key_env = "MY_KEY"\nbase_url = "http://h/v1"\n',
     ("openai", "gpt-4o", "MY_KEY", "http://h/v1")),
    # both given: nothing of the default is taken, not even the key name
    ('provider = "openai"\nmodel = "gpt-4o"\n', ("openai", "gpt-4o", "", "")),
    # an alias becomes the model's id; a provider prefix of a known model too
    ('provider = "openai"\nmodel = "gpt4o"\n', ("openai", "gpt-4o", "", "")),
    ('provider = "openai"\nmodel = "openai/gpt-4o"\n', ("openai", "gpt-4o", "", "")),
    ('provider = "openai"\nmodel = "openai:gpt-4o"\n', ("openai", "gpt-4o", "", "")),
    # an unknown model loses its own provider's prefix ("/" or ":"), nothing else
    ('provider = "vllm"\nmodel = "vllm/my-model"\n', ("vllm", "my-model", "", "")),
    ('provider = "vllm"\nmodel = "vllm:my-model"\n', ("vllm", "my-model", "", "")),
    ('provider = "vllm"\nmodel = "vllm-my-model"\n', ("vllm", "vllm-my-model", "", "")),
    ('provider = "vllm"\nmodel = "other/my-model"\n', ("vllm", "other/my-model", "", "")),
    ('provider = "vllm"\nmodel = "vllm/a/b"\n', ("vllm", "a/b", "", "")),
    # a model whose id starts with its provider's prefix keeps it
    ('provider = "chutes"\nmodel = "chutes/deepseek-ai/DeepSeek-R1"\n',
     ("chutes", "chutes/deepseek-ai/DeepSeek-R1", "", "")),
])
def test_model_resolution(mgr, model_table, expected) -> None:
    h = mgr.spawn(f'name = "m"\n[model]\n{model_table}')
    assert (h.provider, h.model, h.api_key_env, h.base_url) == expected


def test_default_model_of_the_config_is_used(tmp_path) -> None:
    e = Env(tmp_path, {"default_model": {"provider": "ollama", "model": "llama3", "api_key_env": "",
                                         "base_url": "http://10.0.0.1:11434/v1"}})
    try:
        h = e.manager().spawn('name = "d"\n')
        assert (h.provider, h.model, h.api_key_env, h.base_url) == ("ollama", "llama3", "", "http://10.0.0.1:11434/v1")
    finally:
        e.close()


# -- load --------------------------------------------------------------------------------------
@lone_store_only
def test_load_brings_every_agent_back_with_its_fields(env, mgr, caplog) -> None:
    hs = [mgr.spawn(manifest(f"a{i}")) for i in range(5)]
    mgr.set_mode(hs[1], "Observe")
    with orm.db_session:   # a row whose manifest no longer parses is skipped, logged
        env.store.e.AgentRow(id=str(uuid.uuid4()), name="broken", manifest_toml="name = [", manifest={},
                             mode="Auto", state="Running", created_at=hs[0].created_at.replace(tzinfo=None),
                             last_active=hs[0].created_at.replace(tzinfo=None), session_id=str(uuid.uuid4()))
        broken_id = env.store.e.AgentRow.get(name="broken").id
    caplog.set_level(logging.INFO, logger="agentd.agents")
    fresh = env.manager()
    assert fresh.load() == 5
    assert fresh.registry.count() == 5
    assert [h.name for h in fresh.handles()] == ["a0", "a1", "a2", "a3", "a4"], "BUG: listing is not creation order"
    for old in hs:
        new = fresh.get(old.id)
        assert (new.name, new.session_id, new.provider, new.model, new.state) == \
            (old.name, old.session_id, "openai", "gpt-4o", "Running")
        assert new.created_at == old.created_at and new.created_at.tzinfo == timezone.utc
    assert fresh.get(hs[1].id).mode == "Observe" and fresh.get(hs[0].id).mode == "Auto"
    assert fresh.get(hs[1].id).last_active == hs[1].last_active != hs[1].created_at, \
        "BUG: last_active is not restored from the store"
    assert fresh.get(hs[1].id).last_active.tzinfo == timezone.utc
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(f"agent broken ({broken_id}) has an unreadable manifest: "
                                                     "invalid manifest format: TOML syntax error")


def test_load_of_an_empty_store_is_zero(mgr) -> None:
    assert mgr.load() == 0 and mgr.handles() == []


# -- lookups -----------------------------------------------------------------------------------
def test_get_by_id_near_misses(mgr) -> None:
    h = mgr.spawn(manifest("look"))
    assert mgr.get(h.id) is h
    assert mgr.get(h.id.upper()) is h and mgr.get(h.id.replace("-", "")) is h
    for bad in ("look", "", h.id[:-1], h.id + "0"):
        with pytest.raises(BadRequest) as err:
            mgr.get(bad)
        assert err.value.message == f"invalid agent id: {bad!r} is not a UUID"
    with pytest.raises(NotFound) as err:
        mgr.get(str(uuid.uuid4()))
    assert err.value.message == "agent not found"


def test_find_by_id_or_exact_name(mgr) -> None:
    a = mgr.spawn(manifest("finder"))
    b = mgr.spawn(manifest("other"))
    assert mgr.find(a.id) is a and mgr.find(a.id.upper()) is a and mgr.find("finder") is a
    assert mgr.find("other") is b and mgr.find(b.id) is b
    for miss in ("Finder", "finder ", "finde", "finderx", "", str(uuid.uuid4()), a.id[:-1]):
        assert mgr.find(miss) is None, f"BUG: {miss!r} found an agent"


def test_an_agent_named_like_a_uuid_is_found_by_that_name(mgr) -> None:
    name = str(uuid.uuid4())
    h = mgr.spawn(manifest(name))
    assert mgr.find(name) is h and mgr.by_name(name) is h


def test_by_name_is_exact(mgr) -> None:
    h = mgr.spawn(manifest("named"))
    assert mgr.by_name("named") is h
    assert mgr.by_name("Named") is None and mgr.by_name("name") is None and mgr.by_name("") is None
    assert mgr.by_name(h.id) is None


def test_killed_agents_are_not_found_nor_listed(mgr) -> None:
    a = mgr.spawn(manifest("gone"))
    b = mgr.spawn(manifest("stays"))
    mgr.kill(a)
    with pytest.raises(NotFound):
        mgr.get(a.id)
    assert mgr.find(a.id) is None and mgr.find("gone") is None and mgr.by_name("gone") is None
    assert mgr.handles() == [b] and mgr.registry.count() == 1


# -- views -------------------------------------------------------------------------------------
def test_auth_status(mgr, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("MGR_SET_KEY", "v")
    monkeypatch.delenv("MGR_UNSET_KEY", raising=False)
    monkeypatch.setenv("MGR_EMPTY_KEY", "")
    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    cases = [
        (manifest("o"), "configured"),
        (manifest("g", provider="groq", model="llama-3.3-70b-versatile"), "missing"),
        (manifest("ol", provider="ollama", model="llama3"), "not_required"),
        (manifest("ol2", 'api_key_env = "MGR_UNSET_KEY"\n', provider="ollama", model="llama3"), "missing"),
        (manifest("ol3", 'api_key_env = "MGR_SET_KEY"\n', provider="ollama", model="llama3"), "configured"),
        (manifest("g2", 'api_key_env = "MGR_SET_KEY"\n', provider="groq", model="x"), "configured"),
        (manifest("g3", 'api_key_env = "MGR_EMPTY_KEY"\n', provider="groq", model="x"), "missing"),
        (manifest("c", 'base_url = "http://h/v1"\n', provider="mine", model="x"), "not_required"),
        (manifest("c2", 'base_url = "http://h/v1"\napi_key_env = "MGR_UNSET_KEY"\n', provider="mine", model="x"),
         "missing"),
        (manifest("c3", 'base_url = "http://h/v1"\napi_key_env = "MGR_SET_KEY"\n', provider="mine", model="x"),
         "configured"),
    ]
    for text, expected in cases:
        h = mgr.spawn(text)
        assert mgr.registry.auth_status(h) == expected, f"{h.name}: {mgr.registry.auth_status(h)} != {expected}"


def test_summary_list_item_and_detail_shapes(mgr, monkeypatch) -> None:
    from agentd.timestamps import iso

    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    h = mgr.spawn(manifest("shape", 'system_prompt = "Be brief."\n'
                           '[[fallback_models]]\nprovider = "openai"\nmodel = "gpt-4o-mini"\n'
                           '[identity]\nemoji = "🦊"\ncolor = "#ff0000"\navatar_url = "http://a/x.png"\n')
                  .replace('description = "agent shape"\n',
                           'description = "agent shape"\ntags = ["t1", "t2"]\nskills = ["s1"]\n'
                           'mcp_servers = ["fs"]\nprofile = "research"\n'))
    assert mgr.summary(h) == {"id": h.id, "name": "shape", "state": "Running", "mode": "Auto",
                              "created_at": iso(h.created_at), "model_provider": "openai",
                              "model_name": "gpt-4o", "profile": "research"}
    item = mgr.list_item(h)
    assert item == {"id": h.id, "name": "shape", "state": "Running", "mode": "Auto",
                    "created_at": iso(h.created_at), "last_active": iso(h.last_active),
                    "model_provider": "openai", "model_name": "gpt-4o", "model_tier": "smart",
                    "auth_status": "configured", "ready": True, "profile": "research",
                    "identity": {"emoji": "🦊", "avatar_url": "http://a/x.png", "color": "#ff0000"}}
    assert mgr.list_item(h, auth="missing", tier="fast")["model_tier"] == "fast"
    assert mgr.list_item(h, auth="missing", tier="fast")["ready"] is False
    assert mgr.list_item(h, auth="not_required")["ready"] is True
    detail = mgr.detail(h)
    assert detail == {"id": h.id, "name": "shape", "state": "Running", "mode": "Auto", "profile": "research",
                      "created_at": iso(h.created_at), "last_active": iso(h.last_active),
                      "session_id": h.session_id, "model": {"provider": "openai", "model": "gpt-4o"},
                      "capabilities": {"tools": ["web_fetch", "web_search", "file_read", "file_write"],
                                       "network": True},
                      "description": "agent shape", "tags": ["t1", "t2"],
                      "identity": {"emoji": "🦊", "avatar_url": "http://a/x.png", "color": "#ff0000"},
                      "skills": ["s1"], "skills_mode": "allowlist", "mcp_servers": ["fs"],
                      "mcp_servers_mode": "allowlist",
                      "fallback_models": [{"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "",
                                           "base_url": ""}],
                      "system_prompt": "Be brief."}


def test_defaults_in_the_views(mgr, monkeypatch) -> None:
    from agentd.timestamps import iso

    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    h = mgr.spawn(manifest("plain", 'base_url = "http://h/v1"\n', provider="mine", model="own-model"))
    assert mgr.summary(h)["profile"] == "custom"
    item = mgr.list_item(h)
    assert (item["model_tier"], item["auth_status"], item["ready"], item["profile"], item["identity"]) == \
        ("custom", "not_required", True, "custom", {"emoji": "🤖", "avatar_url": None, "color": "#3fb950"})
    detail = mgr.detail(h)
    assert (detail["skills"], detail["skills_mode"], detail["mcp_servers"], detail["mcp_servers_mode"],
            detail["tags"], detail["fallback_models"], detail["system_prompt"], detail["profile"]) == \
        ([], "all", [], "all", [], [], "You are a helpful AI agent.", "custom")
    assert detail["capabilities"]["network"] is False
    assert detail["last_active"] == iso(h.last_active)
    g = mgr.spawn(manifest("keyless", provider="groq", model="llama-3.3-70b-versatile"))
    assert mgr.list_item(g)["ready"] is False and mgr.list_item(g)["auth_status"] == "missing"
    h.state = "Terminated"
    assert mgr.list_item(h)["ready"] is False and mgr.list_item(h)["state"] == "Terminated"


# -- tools -------------------------------------------------------------------------------------
ALL = ["file_read", "file_write", "file_list", "create_directory", "apply_patch", "shell_exec", "web_fetch",
       "web_search", "memory_store", "memory_recall", "memory_remember", "memory_search",
       "knowledge_add_entity", "knowledge_add_relation", "knowledge_query", "agent_list", "agent_find",
       "agent_send", "agent_spawn", "agent_kill", "task_post", "task_claim", "task_complete", "task_list",
       "event_publish", "agent_activate", "a2a_discover", "a2a_send", "skill_list", "skill_describe",
       "skill_execute", "system_time",
       "process_start", "process_poll", "process_write", "process_kill", "process_list", "channel_send",
       "browser_navigate", "browser_click", "browser_type", "browser_screenshot", "browser_read_page",
       "browser_close", "browser_scroll", "browser_wait", "browser_back", "browser_run_js",
       "image_analyze", "media_describe", "media_transcribe", "speech_to_text", "text_to_speech", "image_generate",
       "docker_exec", "schedule_create", "schedule_list", "schedule_delete", "cron_create", "cron_list",
       "cron_cancel"]
UNGATED = [n for n in ALL if n not in ("shell_exec", "web_fetch", "web_search", "agent_spawn", "docker_exec",
                                       "a2a_discover", "a2a_send")
           and not n.startswith(("process_", "browser_"))]
MEDIA_READ_ONLY = ["image_analyze", "media_describe", "media_transcribe", "speech_to_text"]
READ_ONLY = ["file_read", "file_list", "memory_recall", "memory_search", "knowledge_query", "agent_list",
             "agent_find", "task_list", "skill_list", "skill_describe", "skill_execute", "system_time",
             *MEDIA_READ_ONLY]
# Observe mode with every capability granted (profile "full").
FULL_READ_ONLY = ["file_read", "file_list", "web_fetch", "web_search", "memory_recall", "memory_search",
                  "knowledge_query", "agent_list", "agent_find", "task_list", "a2a_discover", "skill_list",
                  "skill_describe", "skill_execute", "system_time", "process_poll",
                  "process_list", "browser_navigate", "browser_screenshot", "browser_read_page", "browser_close",
                  "browser_scroll", "browser_wait", "browser_back", *MEDIA_READ_ONLY]


def tools_of(mgr, extra: str, mode: str | None = None):
    h = mgr.spawn(f'name = "t{mgr.registry.count()}"\n{extra}\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n')
    tools, caps = mgr.registry.effective_tools(h, mode)
    return [t.name for t in tools], caps


def test_effective_tools_without_profile_or_list_are_the_ungated_ones(mgr) -> None:
    names, caps = tools_of(mgr, "")
    assert names == UNGATED
    assert (caps["shell"], caps["network"], caps["agent_spawn"]) == ([], [], False)
    assert "read_only_mode" not in caps


def test_effective_tools_custom_profile_and_star_are_all_ungated(mgr) -> None:
    assert tools_of(mgr, 'profile = "custom"')[0] == UNGATED
    assert tools_of(mgr, '[capabilities]\ntools = ["*"]')[0] == UNGATED
    assert tools_of(mgr, '[capabilities]\ntools = ["file_read", "*"]')[0] == UNGATED


def test_full_profile_implies_every_capability(mgr) -> None:
    names, caps = tools_of(mgr, 'profile = "full"')
    assert names == ALL
    assert (caps["shell"], caps["network"], caps["agent_spawn"]) == (["*"], ["*"], True)


def test_named_profiles_grant_what_their_tools_need(mgr) -> None:
    names, caps = tools_of(mgr, 'profile = "coding"')
    assert names == ["file_read", "file_write", "file_list", "shell_exec", "web_fetch"]
    assert (caps["shell"], caps["network"], caps["agent_spawn"]) == (["*"], ["*"], False)
    names, caps = tools_of(mgr, 'profile = "minimal"')
    assert names == ["file_read", "file_list"] and (caps["shell"], caps["network"]) == ([], [])
    names, caps = tools_of(mgr, 'profile = "Messaging"')
    assert names == ["agent_send", "agent_list", "memory_store", "memory_recall"]


def test_an_explicit_grant_is_not_widened(mgr) -> None:
    names, caps = tools_of(mgr, 'profile = "coding"\n[capabilities]\nshell = ["ls"]\nnetwork = ["example.com"]')
    assert caps["shell"] == ["ls"] and caps["network"] == ["example.com"]
    assert "shell_exec" in names and "web_fetch" in names


def test_an_explicit_list_needs_explicit_capabilities(mgr) -> None:
    names, caps = tools_of(mgr, 'profile = "full"\n[capabilities]\ntools = ["file_read", "shell_exec", "web_fetch", '
                                '"agent_spawn", "nosuch"]')
    assert names == ["file_read"], "BUG: a tool list granted capabilities it did not declare"
    names, _ = tools_of(mgr, '[capabilities]\ntools = ["web_fetch", "file_read", "shell_exec", "agent_spawn"]\n'
                             'network = ["*"]\nshell = ["*"]\nagent_spawn = true')
    assert names == ["web_fetch", "file_read", "shell_exec", "agent_spawn"]


def test_the_handle_itself_is_not_changed_by_implied_capabilities(mgr) -> None:
    h = mgr.spawn('name = "keep"\nprofile = "full"\n')
    mgr.registry.effective_tools(h)
    assert h.manifest.capabilities["shell"] == [] and h.manifest.capabilities["agent_spawn"] is False


def test_observe_mode_offers_read_only_tools(mgr) -> None:
    names, caps = tools_of(mgr, 'profile = "full"', "Observe")
    assert names == FULL_READ_ONLY
    assert caps["read_only_mode"] is True
    h = mgr.spawn('name = "obs"\n')
    mgr.set_mode(h, "Observe")
    tools, caps = mgr.registry.effective_tools(h)
    assert [t.name for t in tools] == READ_ONLY and caps["read_only_mode"] is True
    tools, caps = mgr.registry.effective_tools(h, "Auto")   # an explicit mode wins over the handle's
    assert [t.name for t in tools] == UNGATED and "read_only_mode" not in caps
    names, caps = tools_of(mgr, "", "Manual")
    assert names == UNGATED and "read_only_mode" not in caps



def test_effective_tools_asked_again_follow_the_mode_and_hand_out_copies(mgr) -> None:
    h = mgr.spawn('name = "again"\nprofile = "full"\n')
    for _ in range(2):  # the first answer is worked out, the second comes from the cache
        tools, caps = mgr.registry.effective_tools(h)
        assert [t.name for t in tools] == ALL and "read_only_mode" not in caps
        tools.clear()
        caps["shell"] = ["rm"]
        caps["read_only_mode"] = True
    tools, caps = mgr.registry.effective_tools(h)  # what the callers did to their answers is not kept
    assert [t.name for t in tools] == ALL
    assert caps["shell"] == ["*"] and "read_only_mode" not in caps
    mgr.set_mode(h, "Observe")
    tools, caps = mgr.registry.effective_tools(h)
    assert [t.name for t in tools] == FULL_READ_ONLY
    assert caps["read_only_mode"] is True
    mgr.set_mode(h, "Auto")
    tools, caps = mgr.registry.effective_tools(h)
    assert [t.name for t in tools] == ALL and "read_only_mode" not in caps
    other = mgr.spawn('name = "again2"\nprofile = "minimal"\n')
    other.tools_cache = h.tools_cache  # a cached answer for another manifest is never used
    assert [t.name for t in mgr.registry.effective_tools(other)[0]] == ["file_read", "file_list"]



def test_effective_tools_are_worked_out_once_per_manifest_and_mode(mgr, monkeypatch) -> None:
    from agentd.agents import toolset

    h = mgr.spawn('name = "once"\nprofile = "coding"\n')
    first = [t.name for t in mgr.registry.effective_tools(h)[0]]
    mgr.registry.effective_tools(h, "Observe")  # the cache holds the last mode asked for

    def registry_read_again() -> list:
        raise AssertionError("the tool registry was read again for an answer already worked out")

    monkeypatch.setattr(toolset, "all_tools", registry_read_again)
    assert [t.name for t in mgr.registry.effective_tools(h, "Observe")[0]] == ["file_read", "file_list", "web_fetch"]
    with pytest.raises(AssertionError, match="read again"):
        mgr.registry.effective_tools(h, "Auto")  # another mode: worked out anew
    monkeypatch.undo()
    assert [t.name for t in mgr.registry.effective_tools(h, "Auto")[0]] == first


# -- mode and kill -----------------------------------------------------------------------------
def test_set_mode_persists_and_refuses_unknown_modes(env, mgr) -> None:
    h = mgr.spawn(manifest("moded"))
    before = h.last_active
    mgr.set_mode(h, "Manual")
    assert h.mode == "Manual" and h.last_active > before
    row = row_of(env, h.id)
    assert row["mode"] == "Manual" and row["last_active"].replace(tzinfo=timezone.utc) == h.last_active
    for bad in ("manual", "", "Auto ", "Stop"):
        with pytest.raises(BadRequest) as err:
            mgr.set_mode(h, bad)
        assert err.value.message == f"invalid mode {bad!r}: expected one of Auto, Manual, Observe"
    assert h.mode == "Manual" and row_of(env, h.id)["mode"] == "Manual"


class Memory:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget_agent(self, agent_id: str) -> None:
        self.forgotten.append(agent_id)


def test_kill_deletes_everything_the_agent_owned_and_nothing_else(env, tmp_path, caplog) -> None:
    import threading

    caplog.set_level(logging.INFO, logger="agentd.agents")
    memory = Memory()
    mgr = env.manager(memory=memory)
    a = mgr.spawn(manifest("victim"))
    b = mgr.spawn(manifest("bystander"))
    for h in (a, b):
        mgr.runs.kv.set(h.id, "k", h.name)
        mgr.save_upload(h, "f.txt", "text/plain", b"data")
    legacy = tmp_path / "legacy.bin"
    legacy.write_bytes(b"old")
    kept = tmp_path / "kept.bin"
    kept.write_bytes(b"old")
    from agentd.timestamps import utcnow
    with orm.db_session:
        env.store.e.UploadRow(id=str(uuid.uuid4()), agent=a.id, filename="l", content_type="text/plain", size=3,
                              path=str(legacy), content=None, created_at=utcnow())
        env.store.e.UploadRow(id=str(uuid.uuid4()), agent=b.id, filename="l", content_type="text/plain", size=3,
                              path=str(kept), content=None, created_at=utcnow())
        extra = env.store.e.SessionRow(id=str(uuid.uuid4()), agent=a.id, created_at=utcnow())
        env.store.e.SessionMessageRow(session=extra, body='{"role": "user", "content": "x"}')
        env.store.e.SessionMessageRow(session=b.session_id, body='{"role": "user", "content": "kept"}')
        for h in (a, b):   # each agent's stored /v1/responses answer
            env.store.e.ResponseRow(id=f"resp_{h.name}", agent_id=h.id, created_at=utcnow(), body="{}")
    running = threading.Event()
    a.cancel = running
    env.audit.calls.clear()
    mgr.kill(a)
    assert (a.killed, a.state) == (True, "Terminated")
    assert running.is_set(), "BUG: kill did not stop the running run"
    assert mgr.registry._agents == {b.id: b} and mgr.registry._by_name == {"bystander": b.id}
    assert not legacy.exists() and kept.exists()
    with orm.db_session:
        e = env.store.e
        assert e.AgentRow.get(id=a.id) is None
        assert orm.count(s for s in e.SessionRow if s.agent.id == a.id) == 0
        assert orm.count(k for k in e.KvRow if k.agent.id == a.id) == 0
        assert orm.count(u for u in e.UploadRow if u.agent.id == a.id) == 0
        assert orm.count(s for s in e.SessionRow if s.agent.id == b.id) == 1
        assert [m.body for m in e.SessionMessageRow.select()] == ['{"role": "user", "content": "kept"}'], \
            "BUG: the killed agent's messages outlived it (or the bystander's went with them)"
        assert orm.count(u for u in e.UploadRow if u.agent.id == b.id) == 2
        assert [r.id for r in e.ResponseRow.select()] == ["resp_bystander"]
    assert mgr.runs.kv.get(b.id, "k") == (True, "bystander")
    assert memory.forgotten == [a.id]
    assert f"killed agent victim ({a.id})" in [r.getMessage() for r in caplog.records]
    assert env.audit.calls == [("agent.kill", "victim", {"agent_id": a.id})]
    # The name is free again.
    again = mgr.spawn(manifest("victim"))
    assert mgr.find("victim") is again


def test_kill_cancels_queued_runs_and_works_without_memory_or_audit(env) -> None:
    from agentd.agents.loop import RunCancelled
    from agentd.agents.runqueue import QueuedRun
    import threading

    mgr = env.manager(audit=None)
    h = mgr.spawn(manifest("q"))
    job = QueuedRun(lambda: None, threading.Event())
    h.waiting.append(job)
    mgr.kill(h)
    assert job.cancel.is_set() and isinstance(job.future.exception(), RunCancelled)
    assert h.waiting == collections_deque()


def collections_deque():
    import collections

    return collections.deque()


def test_kill_of_a_handle_whose_name_was_taken_over_keeps_the_new_owner(mgr) -> None:
    old = mgr.spawn(manifest("same"))
    mgr.registry._by_name["same"] = "someone-else"   # the name now belongs to another agent
    mgr.kill(old)
    assert mgr.registry._by_name == {"same": "someone-else"}


# -- a shared database (what PostgreSQL means): every lookup sees the other daemons' agents -------
def shared_view(env):
    """A manager whose store says it is shared (the SQL is the same Pony SQL on SQLite)."""
    import dataclasses

    return env.manager(store=dataclasses.replace(env.store, backend="postgres"))


@lone_store_only
def test_on_a_shared_database_lookups_adopt_what_others_spawned(env, mgr) -> None:
    b = shared_view(env)
    local = env.manager()   # not shared: never looks
    h = mgr.spawn(manifest("s1"))
    with pytest.raises(NotFound):
        local.get(h.id)
    assert local.find("s1") is None and local.by_name("s1") is None and local.handles() == []
    assert b.get(h.id).name == "s1"
    h2 = mgr.spawn(manifest("s2"))
    assert b.find("s2").id == h2.id
    h3 = mgr.spawn(manifest("s3"))
    assert b.find(h3.id).name == "s3" and b.find(h3.id.upper()).name == "s3"
    h4 = mgr.spawn(manifest("s4"))
    assert b.by_name("s4").id == h4.id
    mgr.spawn(manifest("s5"))
    assert [x.name for x in b.handles()] == ["s1", "s2", "s3", "s4", "s5"]
    mgr.kill(mgr.get(h.id))
    with pytest.raises(NotFound):
        b.get(h.id)
    assert b.find("s1") is None


def test_on_a_shared_database_spawn_sees_a_name_taken_elsewhere(env, mgr) -> None:
    b = shared_view(env)
    h = mgr.spawn(manifest("taken"))
    with pytest.raises(Conflict) as err:
        b.spawn(manifest("taken"))
    assert err.value.message == "an agent named 'taken' already exists"
    assert list(b.registry._agents) == [h.id], "the other daemon's agent was adopted by name before the check"


def test_kill_twice_and_a_legacy_upload_whose_file_is_gone(env, mgr, tmp_path) -> None:
    from agentd.timestamps import utcnow

    h = mgr.spawn(manifest("twice"))
    with orm.db_session:
        env.store.e.UploadRow(id=str(uuid.uuid4()), agent=h.id, filename="l", content_type="text/plain", size=3,
                              path=str(tmp_path / "never-existed.bin"), content=None, created_at=utcnow())
    mgr.kill(h)   # the missing file does not stop the kill
    assert row_of(env, h.id) is None
    mgr.kill(h)   # two requests killing the same agent at once: the second finds nothing left
    assert mgr.registry._agents == {} and env.audit.calls[-2:] == [("agent.kill", "twice", {"agent_id": h.id})] * 2


def test_list_json_is_the_listing_of_the_live_agents(mgr, monkeypatch) -> None:
    import json

    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    a = mgr.spawn(manifest("l1"))
    b = mgr.spawn(manifest("l2"))
    mgr.kill(b)
    assert mgr.list_json() == json.dumps([mgr.list_item(a)], separators=(",", ":"))


def test_unknown_tool_warnings_skip_the_wildcard_and_known_names() -> None:
    from agentd.agents.toolset import unknown_tools
    from agentd.agents.tools import all_tools
    known = ", ".join(sorted(t.name for t in all_tools()))
    assert unknown_tools([]) == [] and unknown_tools(["*", "file_read", "shell_exec"]) == []
    assert unknown_tools(["nope", "file_read", "Nope"]) == [
        f"capabilities.tools: unknown tool 'nope' ignored (known: {known})",
        f"capabilities.tools: unknown tool 'Nope' ignored (known: {known})"]


@lone_store_only
def test_an_agent_stored_with_a_bare_string_grant_still_loads(env, mgr) -> None:
    """New manifests must give grants as arrays; an agent accepted before that rule loads."""
    kept = mgr.spawn(manifest("older"))
    with orm.db_session:
        env.store.e.AgentRow.get(id=kept.id).manifest_toml = 'name = "older"\n[capabilities]\ntools = "file_read"\n'
    fresh = env.manager()
    assert fresh.load() == 1
    assert fresh.get(kept.id).manifest.capabilities["tools"] == ["file_read"]


# -- manifest updates, state, in-memory lookups, tools by origin ------------------------------
class Hooks:
    """An AgentHooks that records what it is asked, and refuses a manifest named `refuse`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def check(self, manifest) -> None:
        self.calls.append(("check", manifest.name))
        if manifest.data.get("description") == "refuse":
            raise BadRequest("refused by a hook")

    def spawned(self, handle) -> None:
        self.calls.append(("spawned", handle.model))

    def loaded(self, handle) -> None:
        self.calls.append(("loaded", handle.name))

    def killed(self, handle) -> None:
        self.calls.append(("killed", handle.name))


def test_update_manifest_replaces_the_manifest_and_keeps_the_agent(env, mgr, caplog) -> None:
    caplog.set_level(logging.INFO, logger="agentd.agents")
    hooks = Hooks()
    mgr.registry.hooks = (hooks,)
    h = mgr.spawn(manifest("upd"))
    before = row_of(env, h.id)
    hooks.calls.clear()
    env.audit.calls.clear()
    h.list_json = "cached"
    text = manifest("upd", '[capabilities]\ntools = ["file_read", "no_such_tool"]\n', provider="anthropic",
                    model="claude-sonnet-4-6")
    warnings = mgr.registry.update_manifest(h, text)
    assert warnings == [w for w in warnings if "unknown tool 'no_such_tool' ignored" in w] and len(warnings) == 1
    assert (h.provider, h.model, h.manifest.data["capabilities"]["tools"], h.list_json) == (
        "anthropic", "claude-sonnet-4-6", ["file_read", "no_such_tool"], None)
    row = row_of(env, h.id)
    assert row == {**before, "manifest_toml": text.strip()}
    with orm.db_session:
        assert env.store.e.AgentRow.get(id=h.id).manifest == h.manifest.data
    assert env.audit.calls == [("agent.update", "upd", {"agent_id": h.id, "provider": "anthropic",
                                                         "model": "claude-sonnet-4-6"})]
    assert hooks.calls == [("check", "upd"), ("spawned", "claude-sonnet-4-6")]
    assert f"agent upd ({h.id}) manifest updated: anthropic/claude-sonnet-4-6" in caplog.messages
    assert mgr.find("upd") is h and (h.mode, h.session_id) == ("Auto", before["session_id"])


def test_update_manifest_refusals_change_nothing(env, mgr) -> None:
    hooks = Hooks()
    mgr.registry.hooks = (hooks,)
    h = mgr.spawn(manifest("keep"))
    before, model = row_of(env, h.id), h.model
    env.audit.calls.clear()
    hooks.calls.clear()
    refusals = [("", "manifest_toml is required"), ("  \n", "manifest_toml is required"),
                (manifest("other"), "name: an agent keeps its name ('keep'); spawn a new agent for another"),
                (manifest("keep", provider="nosuch", model="m1"),
                 "invalid manifest format: model.provider: unknown provider 'nosuch' "
                 "(set model.base_url for a custom endpoint)"),
                (manifest("keep").replace('description = "agent keep"', 'description = "refuse"'),
                 "refused by a hook")]
    for text, message in refusals:
        with pytest.raises(BadRequest) as err:
            mgr.registry.update_manifest(h, text)
        assert err.value.message == message, text
    with pytest.raises(BadRequest):
        mgr.registry.update_manifest(h, None)
    assert row_of(env, h.id) == before and h.model == model and env.audit.calls == []
    assert hooks.calls == [("check", "keep"), ("check", "keep")], "only parsed manifests of this agent are checked"
    # A custom endpoint needs no catalog provider.
    assert mgr.registry.update_manifest(h, manifest("keep", 'base_url = "http://127.0.0.1:9/v1"\n',
                                                    provider="nosuch", model="m1")) == []
    assert (h.provider, h.base_url) == ("nosuch", "http://127.0.0.1:9/v1")
    # An agent whose row is gone (killed by another daemon) is not found.
    gone = mgr.spawn(manifest("gone"))
    with orm.db_session:
        env.store.e.AgentRow.get(id=gone.id).delete()
    with pytest.raises(NotFound) as err:
        mgr.registry.update_manifest(gone, manifest("gone", provider="anthropic", model="claude-sonnet-4-6"))
    assert err.value.message == "agent not found" and gone.model == "gpt-4o"


def test_update_manifest_without_an_audit_hook(env) -> None:
    mgr = env.manager(audit=None)
    h = mgr.spawn(manifest("quiet"))
    assert mgr.registry.update_manifest(h, manifest("quiet", model="gpt-4o-mini")) == []
    assert h.model == "gpt-4o-mini"


@lone_store_only
def test_the_key_that_spawned_or_last_changed_an_agent_is_kept_and_loaded_back(env, mgr) -> None:
    def key_of(agent_id: str) -> tuple[str, str | None, str]:
        with orm.db_session:
            stored = env.store.e.AgentRow.get(id=agent_id).key_id
        fresh = env.manager()
        fresh.load()
        return mgr.get(agent_id).key_id, stored, fresh.get(agent_id).key_id

    h = mgr.spawn(manifest("keyed"), key_id="key-1")
    assert key_of(h.id) == ("key-1", "key-1", "key-1")
    mgr.registry.update_manifest(h, manifest("keyed", model="gpt-4o-mini"), key_id="key-2")
    assert key_of(h.id) == ("key-2", "key-2", "key-2")
    # The admin's change makes the agent's manifest the admin's again.
    mgr.registry.update_manifest(h, manifest("keyed"))
    assert key_of(h.id) == ("", None, "")
    assert key_of(mgr.spawn(manifest("admins")).id) == ("", None, "")


def test_set_state_writes_the_handle_and_its_row(env, mgr) -> None:
    h = mgr.spawn(manifest("stated"))
    mgr.registry.set_state(h, "Suspended")
    assert h.state == "Suspended" and row_of(env, h.id)["state"] == "Suspended"
    with orm.db_session:
        env.store.e.AgentRow.get(id=h.id).delete()
    mgr.registry.set_state(h, "Running")   # a row deleted meanwhile: the handle alone
    assert h.state == "Running" and row_of(env, h.id) is None


def test_loaded_and_loaded_handle_are_what_is_in_memory(mgr) -> None:
    a, b = mgr.spawn(manifest("one")), mgr.spawn(manifest("two"))
    assert mgr.registry.loaded() == [a, b]
    assert mgr.registry.loaded_handle(a.id) is a and mgr.registry.loaded_handle("nope") is None
    mgr.kill(a)
    assert mgr.registry.loaded() == [b] and mgr.registry.loaded_handle(a.id) is None


def test_tools_by_origin_groups_built_in_and_skill_tools(mgr) -> None:
    h = mgr.spawn(manifest("grouped", '[capabilities]\ntools = ["file_read", "skill_list", "skill_describe"]\n'))
    groups = mgr.registry.tools_by_origin(h)
    assert {k: sorted(v) for k, v in groups.items()} == {"built-in": ["file_read"],
                                                          "skill": ["skill_describe", "skill_list"]}
    plain = mgr.spawn(manifest("plain", '[capabilities]\ntools = ["file_read"]\n'))
    assert mgr.registry.tools_by_origin(plain) == {"built-in": ["file_read"]}


def test_hooks_hear_of_each_agent_loaded_and_killed(env, mgr) -> None:
    mgr.spawn(manifest("first"))
    second = mgr.spawn(manifest("second"))
    hooks = Hooks()
    again = env.manager()
    again.registry.hooks = (hooks,)
    assert again.registry.load() == 2
    assert sorted(hooks.calls) == [("loaded", "first"), ("loaded", "second")]
    hooks.calls.clear()
    again.registry.kill(again.registry.get(second.id))
    assert hooks.calls == [("killed", "second")]


def test_a_kill_the_database_refuses_leaves_the_agent_as_it_was(env, mgr, monkeypatch) -> None:
    hooks = Hooks()
    mgr.registry.hooks = (hooks,)
    h = mgr.spawn(manifest("stays"))
    mgr.registry.set_state(h, "Suspended")
    hooks.calls.clear()
    env.audit.calls.clear()

    def refuse(agent_id: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(mgr.registry, "_delete_rows", refuse)
    with pytest.raises(OSError):
        mgr.registry.kill(h)
    assert (h.killed, h.state) == (False, "Suspended")
    assert mgr.registry.get(h.id) is h and mgr.registry.find("stays") is h and mgr.registry.by_name("stays") is h
    assert mgr.registry._agents == {h.id: h} and mgr.registry._by_name == {"stays": h.id}
    assert mgr.registry._killing == set() and hooks.calls == [] and env.audit.calls == []
    assert row_of(env, h.id)["state"] == "Suspended"


def test_tools_of_mcp_servers_are_grouped_by_their_server(env) -> None:
    from agentd.agents.tools.base import Tool

    asked: list[list[str]] = []

    def mcp_tools(servers: list[str]) -> list[Tool]:
        asked.append(servers)
        return [Tool("mcp_files_read", "read", {}, lambda ctx, args: "", origin="mcp:files")]

    mgr = env.manager()
    registry = type(mgr.registry)(env.config, env.store, env.catalog, mgr.registry.queues, mcp_tools=mcp_tools)
    h = registry.spawn('name = "remote"\nmcp_servers = ["files"]\n[model]\nprovider = "openai"\nmodel = "gpt-4o"\n'
                       '[capabilities]\ntools = ["file_read", "mcp_files_read"]\n')
    assert registry.tools_by_origin(h) == {"built-in": ["file_read"], "mcp:files": ["mcp_files_read"]}
    assert [t.name for t in registry.effective_tools(h)[0]] == ["file_read", "mcp_files_read"]
    assert asked == [["files"], ["files"]]
    assert [t.name for t in registry.effective_tools(h, "Observe")[0]] == ["file_read"]
