"""Models, providers, keys, usage and budget through the real daemon."""

from __future__ import annotations

import stat
import threading
import uuid
from pathlib import Path

import pytest

from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, db_dump, make_home, run_cli
from tests.agents.test_agents import say, spawn

CUSTOM = {"id": "my-model", "display_name": "My Model", "provider": "openai", "tier": "custom",
          "context_window": 32000, "max_output_tokens": 4096, "input_cost_per_m": 1.5,
          "output_cost_per_m": 2.5, "supports_tools": True, "supports_vision": False,
          "supports_streaming": True}
MODEL_FIELDS = {"id", "display_name", "provider", "tier", "context_window", "max_output_tokens",
                "input_cost_per_m", "output_cost_per_m", "supports_tools", "supports_vision",
                "supports_streaming", "aliases"}


@pytest.fixture
def fresh(tmp_path: Path, fake_llm):
    """A daemon of its own (these tests change budget, keys and usage)."""
    d = Daemon(make_home(tmp_path, llm_config(fake_llm, NO_REMEMBERING)), env_extra=LLM_ENV).start()
    yield d
    d.stop()


def test_model_catalog(agent_daemon) -> None:
    models = agent_daemon.get("/api/models").json()
    assert isinstance(models, list) and len(models) >= 100
    assert len({m["provider"] for m in models}) >= 30
    for m in models:
        assert set(m) == MODEL_FIELDS
        assert m["tier"] in ("frontier", "smart", "balanced", "fast", "local", "custom")
    aliases = agent_daemon.get("/api/models/aliases").json()
    alias, target = next(iter(aliases.items()))
    assert agent_daemon.get(f"/api/models/{alias}").json()["id"] == target
    assert agent_daemon.get("/api/models/gpt-4o").json()["provider"] == "openai"
    r = agent_daemon.get("/api/models/no-such-model")
    assert r.status_code == 404 and "model not found" in r.json()["error"]
    local = [m for m in models if m["tier"] == "local"]
    assert local and all(m["input_cost_per_m"] == 0 and m["output_cost_per_m"] == 0 for m in local)
    assert all(m["provider"] == "openai" for m in agent_daemon.get("/api/models?provider=openai").json())


def test_providers_listing(agent_daemon) -> None:
    providers = {p["id"]: p for p in agent_daemon.get("/api/providers").json()}
    assert len(providers) >= 30
    openai = providers["openai"]
    assert set(openai) == {"id", "display_name", "api_key_env", "base_url", "key_required", "auth_status",
                           "model_count"}
    assert openai["auth_status"] == "configured" and openai["model_count"] > 0
    assert openai["base_url"].startswith("http://127.0.0.1")  # the config's provider_urls
    local = [p for p in providers.values() if not p["key_required"]]
    assert len(local) == 3 and all(p["auth_status"] == "not_required" for p in local)
    assert providers["groq"]["auth_status"] == "missing"
    assert agent_daemon.post("/api/providers/nonesuch/test").status_code == 404


def test_custom_models(fresh) -> None:
    r = fresh.post("/api/models/custom", json=CUSTOM)
    assert r.status_code == 201 and r.json() == {"status": "added", "model_id": "my-model"}
    listed = [m for m in fresh.get("/api/models").json() if m["id"] == "my-model"]
    assert listed and listed[0]["tier"] == "custom" and listed[0]["input_cost_per_m"] == 1.5
    assert fresh.post("/api/models/custom", json=CUSTOM).status_code == 409
    for change, word in (({"input_cost_per_m": -1}, "input_cost_per_m"), ({"tier": "mega"}, "tier"),
                         ({"provider": "nowhere"}, "provider"), ({"context_window": "big"}, "context_window"),
                         ({"supports_tools": "yes"}, "supports_tools")):
        r = fresh.post("/api/models/custom", json={**CUSTOM, "id": f"x-{uuid.uuid4().hex[:4]}", **change})
        assert r.status_code == 400 and word in r.json()["error"], (change, r.text)
    # Only id and provider are needed: the rest takes defaults, the name being the id.
    r = fresh.post("/api/models/custom", json={"id": "bare-model", "provider": "ollama"})
    assert r.status_code == 201, r.text
    assert fresh.get("/api/models/bare-model").json() == {
        "id": "bare-model", "display_name": "bare-model", "provider": "ollama", "tier": "custom",
        "context_window": 128000, "max_output_tokens": 8192, "input_cost_per_m": 0.0, "output_cost_per_m": 0.0,
        "supports_tools": True, "supports_vision": False, "supports_streaming": True, "aliases": []}
    r = fresh.post("/api/models/custom", json={"id": "no-provider"})
    assert (r.status_code, r.json()) == (400, {"error": "invalid request: provider: Missing data for required field."})
    # custom models are priced like any other
    agent_id = spawn(fresh, model='[model]\nprovider = "openai"\nmodel = "my-model"\n')
    assert say(fresh, agent_id, "priced").json()["cost_usd"] > 0
    # A tier named is kept, across a restart too.
    assert fresh.post("/api/models/custom", json={"id": "fast-one", "provider": "ollama", "tier": "fast"}
                      ).status_code == 201
    fresh.stop()
    fresh.start()
    assert fresh.get("/api/models/my-model").json()["tier"] == "custom"
    assert fresh.get("/api/models/fast-one").json()["tier"] == "fast"
    assert "fast-one" in {m["id"] for m in fresh.get("/api/models", params={"tier": "fast"}).json()}
    # Any case, as GET finds it.
    assert fresh.delete("/api/models/custom/FAST-One").json() == {"status": "removed", "model_id": "fast-one"}
    assert fresh.delete("/api/models/custom/my-model").json() == {"status": "removed", "model_id": "my-model"}
    assert fresh.delete("/api/models/custom/my-model").status_code == 404
    assert fresh.delete("/api/models/custom/gpt-4o").status_code == 404


def test_provider_keys_live_in_secrets_env(fresh) -> None:
    r = fresh.post("/api/providers/groq/key", json={"api_key": "gsk-test-123"})
    assert r.json() == {"status": "configured", "provider": "groq", "env_var": "GROQ_API_KEY"}
    secrets = fresh.home / "secrets.env"
    assert "GROQ_API_KEY=gsk-test-123" in secrets.read_text()
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert "gsk-test-123" not in (fresh.home / "config.toml").read_text()
    assert "gsk-test-123" not in fresh.log()
    db = db_dump(fresh.home)
    assert b"gsk-test-123" not in db
    groq = [p for p in fresh.get("/api/providers").json() if p["id"] == "groq"][0]
    assert groq["auth_status"] == "configured"
    fresh.stop()
    fresh.start()
    groq = [p for p in fresh.get("/api/providers").json() if p["id"] == "groq"][0]
    assert groq["auth_status"] == "configured"
    assert fresh.delete("/api/providers/groq/key").json() == {"status": "removed", "provider": "groq"}
    assert "GROQ_API_KEY" not in secrets.read_text()
    for body, word in (({}, "api_key"), ({"api_key": "a\nb"}, "single line"), ({"api_key": 5}, "api_key")):
        r = fresh.post("/api/providers/groq/key", json=body)
        assert r.status_code == 400 and word in r.json()["error"]
    assert fresh.post("/api/providers/ollama/key", json={"api_key": "x"}).status_code == 400
    assert fresh.post("/api/providers/nope/key", json={"api_key": "x"}).status_code == 404


def test_provider_url_and_test(fresh, fake_llm) -> None:
    r = fresh.post("/api/providers/openai/test")
    assert r.status_code == 200 and r.json()["status"] == "success"
    assert isinstance(r.json()["response_time_ms"], int)
    r = fresh.put("/api/providers/groq/url", json={"base_url": "ftp://x"})
    assert r.status_code == 400
    r = fresh.put("/api/providers/groq/url", json={"base_url": fake_llm.openai_base + "/"})
    assert r.json() == {"status": "updated", "provider": "groq", "base_url": fake_llm.openai_base}
    r = fresh.post("/api/providers/groq/test")
    assert r.status_code == 400 and "GROQ_API_KEY" in r.json()["error"]
    fresh.post("/api/providers/groq/key", json={"api_key": "k"})
    assert fresh.post("/api/providers/groq/test").json()["status"] == "success"
    agent_id = spawn(fresh, model='[model]\nprovider = "groq"\nmodel = "llama-3.3-70b-versatile"\n')
    assert say(fresh, agent_id, "via groq url").json()["response"] == "echo: via groq url"
    fresh.put("/api/providers/groq/url", json={"base_url": "http://127.0.0.1:9/v1"})
    r = fresh.post("/api/providers/groq/test")
    assert r.status_code == 502 and "cannot reach" in r.json()["error"]


def test_usage_and_budget(fresh) -> None:
    agent_id = spawn(fresh, "spender")
    before = fresh.get("/api/usage").json()
    assert before["total_input_tokens"] == 0 and before["total_cost_usd"] == 0
    results = [say(fresh, agent_id, f"spend {i}").json() for i in range(3)]
    usage = fresh.get("/api/usage").json()
    assert usage["total_input_tokens"] == sum(r["input_tokens"] for r in results)
    assert usage["total_output_tokens"] == sum(r["output_tokens"] for r in results)
    assert usage["total_cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in results))
    assert usage["period_start"].endswith("+00:00") and usage["period_start"][8:10] == "01"
    by_model = fresh.get("/api/usage/by-model").json()
    assert by_model == [{"model": "gpt-4o", "input_tokens": usage["total_input_tokens"],
                         "output_tokens": usage["total_output_tokens"], "cost_usd": by_model[0]["cost_usd"],
                         "requests": 3}]
    assert fresh.get("/api/usage?since=2000-01-01&until=2000-02-01").json()["total_input_tokens"] == 0
    assert fresh.get("/api/usage?since=yesterday").status_code == 400
    per_agent = fresh.get("/api/budget/agents").json()
    assert per_agent[0]["agent_id"] == agent_id and per_agent[0]["agent_name"] == "spender"
    for bad in ({"limit_usd": "10"}, {"limit_usd": -1}, {}, {"limit_usd": True}):
        assert fresh.put("/api/budget", json=bad).status_code == 400, bad
    spent = usage["total_cost_usd"]
    r = fresh.put("/api/budget", json={"limit_usd": spent * 1.1})
    assert r.json() == {"status": "updated", "limit_usd": spent * 1.1}
    status = fresh.get("/api/budget").json()
    assert status["spent_usd"] == pytest.approx(spent)
    assert [a["level"] for a in status["alerts"]] == ["warning"]
    say(fresh, agent_id, "push it over")
    status = fresh.get("/api/budget").json()
    assert [a["level"] for a in status["alerts"]] == ["warning", "critical"]
    assert status["remaining_usd"] == 0
    r = say(fresh, agent_id, "refused")
    assert r.status_code == 429 and r.json()["error"].startswith("message delivery failed: quota exceeded: monthly budget reached")
    assert int(r.headers["Retry-After"]) > 0
    r = fresh.post("/v1/chat/completions", json={"model": "spender", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 429 and "monthly budget reached" in r.json()["error"]["message"]
    fresh.put("/api/budget", json={"limit_usd": 0})
    assert say(fresh, agent_id, "unlimited again").status_code == 200
    totals = fresh.get("/api/usage").json()
    fresh.stop()
    fresh.start()
    assert fresh.get("/api/usage").json() == totals
    out = run_cli(fresh.home, "usage", port=fresh.port)
    assert out.returncode == 0 and "gpt-4o" in out.stdout
    out = run_cli(fresh.home, "budget", "--set", "5", port=fresh.port)
    assert out.returncode == 0 and "$5.00" in out.stdout


def test_budget_alert_levels(fresh) -> None:
    assert fresh.get("/api/budget").json()["alert_levels"] == [0.8, 1.0], "the default levels"
    for bad in ([], [0], [1.5], [-0.5], ["0.5"], [True], 0.5, [0.1 * i for i in range(1, 11)] + [0.05]):
        r = fresh.put("/api/budget", json={"limit_usd": 1, "alert_levels": bad})
        assert r.status_code == 400 and "alert_levels" in r.json()["error"], (bad, r.text)
    assert fresh.get("/api/budget").json()["limit_usd"] == 0, "a refused body changes nothing"
    agent_id = spawn(fresh, "levels")
    cost = say(fresh, agent_id, "one call").json()["cost_usd"]
    r = fresh.put("/api/budget", json={"limit_usd": cost * 1.6, "alert_levels": [1, 0.5, 0.5, 0.25]})
    assert r.status_code == 200
    assert r.json() == {"status": "updated", "limit_usd": cost * 1.6, "alert_levels": [0.25, 0.5, 1.0]}
    status = fresh.get("/api/budget").json()
    assert status["alert_levels"] == [0.25, 0.5, 1.0]
    assert [(a["level"], a["threshold"]) for a in status["alerts"]] == [("warning", 0.25), ("warning", 0.5)]
    assert status["alerts"][0]["message"].startswith("25% of the monthly budget is spent: $")
    # Without alert_levels the limit changes and the levels stay.
    r = fresh.put("/api/budget", json={"limit_usd": cost * 1.6})
    assert r.json() == {"status": "updated", "limit_usd": cost * 1.6}
    assert fresh.get("/api/budget").json()["alert_levels"] == [0.25, 0.5, 1.0]
    fresh.stop()
    fresh.start()
    status = fresh.get("/api/budget").json()
    assert status["alert_levels"] == [0.25, 0.5, 1.0], "the levels are kept in the database"
    say(fresh, agent_id, "over the limit")
    alerts = fresh.get("/api/budget").json()["alerts"]
    assert [(a["level"], a["threshold"]) for a in alerts] == [("warning", 0.25), ("warning", 0.5), ("critical", 1.0)]
    assert alerts[2]["message"].startswith("budget exhausted: $")


def test_concurrent_spending_is_exact(fresh) -> None:
    ids = [spawn(fresh) for _ in range(32)]
    results: list[dict] = []
    lock = threading.Lock()

    def spend(agent_id: str) -> None:
        for i in range(3):
            body = say(fresh, agent_id, f"concurrent {i} from {agent_id}").json()
            with lock:
                results.append(body)

    threads = [threading.Thread(target=spend, args=(a,)) for a in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 96
    usage = fresh.get("/api/usage").json()
    assert usage["total_input_tokens"] == sum(r["input_tokens"] for r in results)
    assert usage["total_cost_usd"] == pytest.approx(sum(r["cost_usd"] for r in results), rel=1e-9)
    agents = fresh.get("/api/budget/agents").json()
    assert len(agents) == 32 and all(a["input_tokens"] > 0 for a in agents)


def test_provider_key_that_cannot_travel_in_a_header_is_refused(fresh) -> None:
    # Found by schemathesis: a non-Latin-1 key was stored, then POST .../test crashed (500)
    # encoding it into the Authorization header.
    for bad in ("sk-ünïcode", "sk-\u2603", "sk-\x07bell"):
        r = fresh.post("/api/providers/openai/key", json={"api_key": bad})
        assert r.status_code == 400 and "ASCII" in r.json()["error"], (bad, r.text)
    r = fresh.post("/api/providers/openai/test")
    assert r.status_code != 500
    assert "Traceback" not in fresh.log()
