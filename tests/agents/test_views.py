"""What the API shows of an agent (agentd/agents/views.py), called directly on handles built
from manifests and the real catalog: its key status, the fix a missing key needs, its
summary, list item and detail. (The same shapes through a real manager: tests/agents/test_registry.py.)"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from agentd.agents.handle import AgentHandle
from agentd.agents.manifest import parse_manifest
from agentd.agents.toolset import builtin_tools
from agentd.agents.views import auth_status, detail, list_item, missing_key, summary
from agentd.llm import catalog as catalog_mod
from agentd.llm.catalog import Catalog

CREATED = datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def handle(provider: str = "openai", model: str = "gpt-4o", api_key_env: str = "", extra: str = "",
           state: str = "Running") -> AgentHandle:
    return AgentHandle(id=str(uuid.uuid4()), name="v", manifest=parse_manifest(f'name = "v"\n{extra}'), mode="Auto",
                       state=state, created_at=CREATED, last_active=CREATED + timedelta(seconds=90),
                       session_id=str(uuid.uuid4()), provider=provider, model=model, api_key_env=api_key_env,
                       base_url="")


@pytest.fixture()
def keys(monkeypatch):
    for name in ("OPENAI_API_KEY", "GROQ_API_KEY", "VIEWS_UNSET_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VIEWS_SET_KEY", "v")
    return monkeypatch


@pytest.mark.parametrize("provider, api_key_env, env, expected", [
    ("openai", "", {"OPENAI_API_KEY": "sk"}, "configured"),
    ("openai", "", {}, "missing"),
    ("openai", "", {"OPENAI_API_KEY": ""}, "missing"),
    ("OpenAI", "", {}, "missing"),                      # provider ids are case-insensitive
    ("openai", "VIEWS_SET_KEY", {}, "configured"),      # the agent's own key variable wins
    ("openai", "VIEWS_UNSET_KEY", {"OPENAI_API_KEY": "sk"}, "missing"),
    ("ollama", "", {}, "not_required"),
    ("ollama", "VIEWS_UNSET_KEY", {}, "missing"),      # a key the agent names is needed
    ("ollama", "VIEWS_SET_KEY", {}, "configured"),
    ("mine", "", {}, "not_required"),                   # no catalog provider, no key named
    ("mine", "VIEWS_SET_KEY", {}, "configured"),
    ("mine", "VIEWS_UNSET_KEY", {}, "missing"),
])
def test_auth_status(catalog, keys, provider, api_key_env, env, expected) -> None:
    for name, value in env.items():
        keys.setenv(name, value)
    assert auth_status(catalog, handle(provider, api_key_env=api_key_env)) == expected


def test_a_provider_whose_key_is_optional_needs_none(keys) -> None:
    # (a local server that takes a key when given one: it names the variable, needs no key)
    builtin = catalog_mod._builtin()
    ollama = next(p for p in builtin.providers if p.id == "ollama")
    optional = dataclasses.replace(ollama, api_key_env="VIEWS_UNSET_KEY")
    catalog = Catalog(dataclasses.replace(builtin, providers=(optional,)))
    assert auth_status(catalog, handle("ollama")) == "not_required"
    assert missing_key(catalog, handle("ollama")) is None
    assert auth_status(catalog, handle("ollama", api_key_env="VIEWS_UNSET_KEY")) == "missing"


def test_what_a_missing_key_needs(catalog, keys) -> None:
    assert missing_key(catalog, handle("groq", "llama-3.3-70b-versatile")) == \
        "provider groq has no API key: set GROQ_API_KEY or POST /api/providers/groq/key"
    # a key variable of the agent's own: only the environment can set it
    assert missing_key(catalog, handle("groq", api_key_env="VIEWS_UNSET_KEY")) == \
        "provider groq has no API key: set VIEWS_UNSET_KEY"
    assert missing_key(catalog, handle("groq", api_key_env="GROQ_API_KEY")) == \
        "provider groq has no API key: set GROQ_API_KEY or POST /api/providers/groq/key"
    assert missing_key(catalog, handle("mine", api_key_env="VIEWS_UNSET_KEY")) == \
        "provider mine has no API key: set VIEWS_UNSET_KEY"
    keys.setenv("GROQ_API_KEY", "gsk")
    assert missing_key(catalog, handle("groq")) is None
    assert missing_key(catalog, handle("ollama")) is None and missing_key(catalog, handle("mine")) is None


def test_summary(catalog) -> None:
    h = handle(extra='profile = "coding"\n')
    assert summary(h) == {"id": h.id, "name": "v", "state": "Running", "mode": "Auto",
                          "created_at": "2026-03-04T05:06:07.890000+00:00", "model_provider": "openai",
                          "model_name": "gpt-4o", "profile": "coding"}
    assert summary(handle())["profile"] == "custom"


def test_list_item_looks_up_what_the_caller_did_not(catalog, keys) -> None:
    keys.setenv("OPENAI_API_KEY", "sk")
    h = handle(extra='[identity]\nemoji = "🦊"\ncolor = "#ff0000"\navatar_url = "http://a/x.png"\n')
    assert list_item(catalog, h) == {
        "id": h.id, "name": "v", "state": "Running", "mode": "Auto", "created_at": "2026-03-04T05:06:07.890000+00:00",
        "last_active": "2026-03-04T05:07:37.890000+00:00", "model_provider": "openai", "model_name": "gpt-4o",
        "model_tier": "smart", "auth_status": "configured", "ready": True, "profile": "custom",
        "identity": {"emoji": "🦊", "avatar_url": "http://a/x.png", "color": "#ff0000"}}
    given = list_item(catalog, h, auth="missing", tier="fast")
    assert (given["model_tier"], given["auth_status"], given["ready"]) == ("fast", "missing", False)
    assert list_item(catalog, handle(model="own-model"))["model_tier"] == "custom"
    assert list_item(catalog, handle("groq"))["ready"] is False
    assert list_item(catalog, handle("ollama", "llama3"), tier="x")["ready"] is True
    assert list_item(catalog, handle(state="Suspended"))["ready"] is False


def test_detail(catalog, keys) -> None:
    h = handle(extra='description = "d"\ntags = ["a"]\nskills = ["s"]\nmcp_servers = ["fs"]\n'
                     'profile = "research"\n[model]\nsystem_prompt = "Be brief."\n'
                     '[[fallback_models]]\nprovider = "groq"\nmodel = "m"\n')
    tools, caps = builtin_tools(h, "Auto")
    assert detail(catalog, h, tools, caps) == {
        "id": h.id, "name": "v", "state": "Running", "mode": "Auto", "profile": "research",
        "created_at": "2026-03-04T05:06:07.890000+00:00", "last_active": "2026-03-04T05:07:37.890000+00:00",
        "session_id": h.session_id, "model": {"provider": "openai", "model": "gpt-4o"},
        "capabilities": {"tools": ["web_fetch", "web_search", "file_read", "file_write"], "network": True},
        "description": "d", "tags": ["a"], "identity": {"emoji": "🤖", "avatar_url": None, "color": "#3fb950"},
        "skills": ["s"], "skills_mode": "allowlist", "mcp_servers": ["fs"], "mcp_servers_mode": "allowlist",
        "fallback_models": [{"provider": "groq", "model": "m", "api_key_env": "", "base_url": ""}],
        "system_prompt": "Be brief."}
    plain = handle()
    shown = detail(catalog, plain, [], {"network": []})
    assert (shown["capabilities"], shown["skills_mode"], shown["mcp_servers_mode"], shown["profile"]) == \
        ({"tools": [], "network": False}, "all", "all", "custom")
