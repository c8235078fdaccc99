"""The catalog data files and lookups (plain unit tests, no daemon)."""

from __future__ import annotations

import json
import threading
from importlib import resources

import pytest

from agentd.llm.catalog import TIERS, Catalog, ModelInfo

FIELDS = {"id": str, "display_name": str, "provider": str, "tier": str, "context_window": int,
          "max_output_tokens": int, "input_cost_per_m": float, "output_cost_per_m": float,
          "supports_tools": bool, "supports_vision": bool, "supports_streaming": bool, "aliases": list}
BUILTIN_TIERS = {"frontier", "smart", "balanced", "fast", "local"}


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog.load()


def custom_model(model_id: str = "my-model", **overrides) -> ModelInfo:
    fields = dict(id=model_id, display_name="Mine", provider="ollama", tier="custom", context_window=8192,
                  max_output_tokens=1024, input_cost_per_m=1.0, output_cost_per_m=2.0,
                  supports_tools=False, supports_vision=False, supports_streaming=True)
    return ModelInfo(**{**fields, **overrides})


# -- data invariants -----------------------------------------------------------
def test_data_files_are_package_data() -> None:
    data = resources.files("agentd.data")
    for name in ("providers.json", "models.json", "aliases.json"):
        assert json.loads(data.joinpath(name).read_text(encoding="utf-8"))


def test_size_and_shape(catalog) -> None:
    models, providers = catalog.models(), catalog.providers()
    assert len(models) >= 100 and len(providers) >= 30
    assert len({m.provider for m in models}) >= 30
    assert len({p.id for p in providers}) == len(providers)
    assert len({m.id for m in models}) == len(models)
    known = {p.id for p in providers}
    for m in models:
        d = m.to_dict()
        assert set(d) == set(FIELDS)
        assert all(type(d[k]) is t for k, t in FIELDS.items()), m.id  # bool is not an int here
        assert m.tier in BUILTIN_TIERS and m.tier in TIERS
        assert m.input_cost_per_m >= 0 and m.output_cost_per_m >= 0
        assert m.context_window > 0 and m.max_output_tokens > 0
        assert m.provider in known
    assert {p.kind for p in providers} == {"openai", "anthropic", "gemini"}


def test_three_free_local_runners(catalog) -> None:
    local = [p for p in catalog.providers() if not p.key_required]
    assert sorted(p.id for p in local) == ["lmstudio", "ollama", "vllm"]
    for p in local:
        assert catalog.models(provider=p.id)
        assert all(m.tier == "local" and m.input_cost_per_m == m.output_cost_per_m == 0
                   for m in catalog.models(provider=p.id))
    assert {m.provider for m in catalog.models(tier="local")} == {"lmstudio", "ollama", "vllm"}


def test_known_providers_and_models(catalog) -> None:
    openai, anthropic, gemini = (catalog.get_provider(p) for p in ("openai", "anthropic", "gemini"))
    assert (openai.kind, openai.api_key_env, openai.base_url) == ("openai", "OPENAI_API_KEY", "https://api.openai.com/v1")
    assert (anthropic.kind, anthropic.base_url) == ("anthropic", "https://api.anthropic.com")
    assert (gemini.kind, gemini.base_url) == ("gemini", "https://generativelanguage.googleapis.com")
    assert catalog.get_provider("GROQ").api_key_env == "GROQ_API_KEY"
    assert catalog.get_model("llama-3.3-70b-versatile").provider == "groq"
    assert catalog.get_model("deepseek-chat").supports_vision is False
    gpt4o = catalog.get_model("gpt-4o")
    assert gpt4o.supports_vision and gpt4o.input_cost_per_m > 0 and gpt4o.output_cost_per_m > 0
    for dropped in ("codex", "lemonade", "bedrock", "azure", "github-copilot", "claude-code"):
        assert catalog.get_provider(dropped) is None
    assert catalog.get_provider("nope") is None


def test_aliases_point_at_models(catalog) -> None:
    aliases = catalog.aliases()
    assert aliases["sonnet"] == "claude-sonnet-4-6"
    assert "sonnet" in catalog.get_model("claude-sonnet-4-6").aliases
    assert list(aliases) == sorted(aliases)
    ids = {m.id.lower() for m in catalog.models()}
    for alias, target in aliases.items():
        assert alias == alias.lower() and alias not in ids
        assert catalog.get_model(target).id == target
    aliases["sonnet"] = "changed"  # a copy: the catalog is unaffected
    assert catalog.aliases()["sonnet"] == "claude-sonnet-4-6"


def test_model_alias_lists_match_the_map(catalog) -> None:
    aliases = catalog.aliases()
    for m in catalog.models():
        assert all(aliases[a] == m.id for a in m.aliases), m.id


# -- lookups -------------------------------------------------------------------
@pytest.mark.parametrize("ref", ["gpt-4o", "GPT-4o", "gpt4o", "openai/gpt-4o", "openai:gpt-4o", "OpenAI/GPT4O"])
def test_lookup_forms(catalog, ref) -> None:
    assert catalog.get_model(ref).id == "gpt-4o"


def test_lookup_by_alias_and_prefix(catalog) -> None:
    assert catalog.get_model("SONNET").id == "claude-sonnet-4-6"
    assert catalog.get_model("anthropic/sonnet").id == "claude-sonnet-4-6"
    assert catalog.get_model("groq:llama-3.3-70b-versatile").provider == "groq"
    # Ids that contain a provider-like prefix or a colon are plain ids.
    assert catalog.get_model("openrouter/openai/gpt-4o").provider == "openrouter"
    assert catalog.get_model("mistral:latest").provider == "ollama"


def test_unknown_and_mismatched_prefix(catalog) -> None:
    assert catalog.get_model("no-such-model") is None
    assert catalog.get_model("") is None
    assert catalog.get_model("nope/gpt-4o") is None
    assert catalog.get_model("anthropic/gpt-4o") is None  # not an Anthropic model
    assert catalog.resolve("no-such-model") == "no-such-model"
    assert catalog.resolve("sonnet") == "claude-sonnet-4-6"
    assert catalog.resolve("openai/gpt-4o") == "gpt-4o"


def test_filters_and_counts(catalog) -> None:
    assert catalog.models(provider="OpenAI") == catalog.models(provider="openai")
    assert all(m.provider == "openai" for m in catalog.models(provider="openai"))
    assert all(m.tier == "fast" for m in catalog.models(tier="FAST"))
    assert catalog.models(provider="nope") == [] and catalog.model_count("nope") == 0
    assert sum(catalog.model_count(p.id) for p in catalog.providers()) == len(catalog.models())
    assert catalog.model_count("Anthropic") == len(catalog.models(provider="anthropic")) > 0


# -- cost ----------------------------------------------------------------------
def test_cost_formula(catalog) -> None:
    m = catalog.get_model("gpt-4o")
    assert catalog.cost_usd("gpt-4o", 1_000_000, 2_000_000) == pytest.approx(
        m.input_cost_per_m + 2 * m.output_cost_per_m)
    expected = round((1234 * m.input_cost_per_m + 567 * m.output_cost_per_m) / 1e6, 10)
    assert catalog.cost_usd("openai/gpt-4o", 1234, 567) == expected
    assert catalog.cost_usd("gpt-4o", 0, 0) == 0
    assert catalog.cost_usd("nope", 1, 1) is None
    assert catalog.cost_usd("llama3.2", 10**6, 10**6) == 0.0


# -- custom models -------------------------------------------------------------
def test_custom_models_are_per_instance(catalog) -> None:
    info = custom_model()
    catalog.add_custom(info)
    assert catalog.get_model("MY-MODEL") is info and catalog.models(tier="custom") == [info]
    assert catalog.models()[-1] is info  # customs come after the built-ins
    assert catalog.model_count("ollama") == len(Catalog.load().models(provider="ollama")) + 1
    assert catalog.cost_usd("my-model", 10**6, 10**6) == 3.0
    assert Catalog.load().get_model("my-model") is None
    assert catalog.remove_custom("gpt-4o") is False and catalog.get_model("gpt-4o") is not None
    assert catalog.remove_custom("my-model") is True and catalog.get_model("my-model") is None
    assert catalog.remove_custom("my-model") is False
    assert catalog.models(tier="custom") == []


def test_custom_models_keep_their_tier(catalog) -> None:
    catalog.add_custom(custom_model(tier="fast", aliases=["mine"]))
    model = catalog.get_model("my-model")
    assert model.tier == "fast" and catalog.custom_models() == [model]
    assert catalog.models(tier="fast")[-1] is model
    assert catalog.get_model("mine") is model and catalog.aliases()["mine"] == "my-model"


def test_custom_alias_never_shadows_builtins(catalog) -> None:
    catalog.add_custom(custom_model(aliases=["sonnet", "gpt-4o"]))
    assert catalog.get_model("sonnet").id == "claude-sonnet-4-6"
    assert catalog.get_model("gpt-4o").provider == "openai"


def test_concurrent_custom_changes(catalog) -> None:
    errors: list[BaseException] = []

    def churn(n: int) -> None:
        try:
            for i in range(50):
                catalog.add_custom(custom_model(f"m-{n}-{i}"))
                catalog.models()
                assert catalog.get_model(f"m-{n}-{i}") is not None
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(catalog.models(tier="custom")) == 400
