"""The catalog data files and lookups (no daemon)."""

from __future__ import annotations

import pytest

from agentd.llm.catalog import TIERS, Catalog, ModelInfo

FIELDS = {"id": str, "display_name": str, "provider": str, "tier": str, "context_window": int,
          "max_output_tokens": int, "input_cost_per_m": float, "output_cost_per_m": float,
          "supports_tools": bool, "supports_vision": bool, "supports_streaming": bool, "aliases": list}


@pytest.fixture()
def catalog() -> Catalog:
    return Catalog.load()


def test_size_and_shape(catalog) -> None:
    models, providers = catalog.models(), catalog.providers()
    assert len(models) >= 100 and len(providers) >= 30
    assert len({m.provider for m in models}) >= 30
    known = {p.id for p in providers}
    for m in models:
        d = m.to_dict()
        assert set(d) == set(FIELDS)
        assert all(isinstance(d[k], t) for k, t in FIELDS.items()), m.id
        assert m.tier in TIERS and m.tier != "custom"
        assert m.input_cost_per_m >= 0 and m.output_cost_per_m >= 0 and m.provider in known
    assert {p.kind for p in providers} == {"openai", "anthropic", "gemini"}


def test_three_free_local_runners(catalog) -> None:
    local = [p for p in catalog.providers() if not p.key_required]
    assert sorted(p.id for p in local) == ["lmstudio", "ollama", "vllm"]
    for p in local:
        assert all(m.tier == "local" and m.input_cost_per_m == m.output_cost_per_m == 0
                   for m in catalog.models(provider=p.id))


def test_aliases_point_at_models(catalog) -> None:
    aliases = catalog.aliases()
    assert aliases["sonnet"] == "claude-sonnet-4-6"
    for alias, target in aliases.items():
        assert alias == alias.lower() and catalog.get_model(target).id == target


@pytest.mark.parametrize("ref", ["gpt-4o", "GPT-4o", "gpt4o", "openai/gpt-4o", "openai:gpt-4o", "OpenAI/GPT4O"])
def test_lookup_forms(catalog, ref) -> None:
    assert catalog.get_model(ref).id == "gpt-4o"


def test_unknown_and_mismatched_prefix(catalog) -> None:
    assert catalog.get_model("no-such-model") is None
    assert catalog.get_model("anthropic/gpt-4o") is None
    assert catalog.resolve("no-such-model") == "no-such-model" and catalog.resolve("sonnet") == "claude-sonnet-4-6"


def test_cost_formula(catalog) -> None:
    m = catalog.get_model("gpt-4o")
    assert catalog.cost_usd("gpt-4o", 1_000_000, 2_000_000) == pytest.approx(
        m.input_cost_per_m + 2 * m.output_cost_per_m)
    assert catalog.cost_usd("nope", 1, 1) is None
    assert catalog.cost_usd("llama3.2", 10**6, 10**6) in (0.0, None)


def test_custom_models_are_per_instance(catalog) -> None:
    info = ModelInfo(id="my-model", display_name="Mine", provider="ollama", tier="custom", context_window=8192,
                     max_output_tokens=1024, input_cost_per_m=1.0, output_cost_per_m=2.0,
                     supports_tools=False, supports_vision=False, supports_streaming=True)
    catalog.add_custom(info)
    assert catalog.get_model("MY-MODEL") is info and catalog.models(tier="custom") == [info]
    assert catalog.model_count("ollama") == len(Catalog.load().models(provider="ollama")) + 1
    assert Catalog.load().get_model("my-model") is None
    assert catalog.remove_custom("gpt-4o") is False and catalog.get_model("gpt-4o") is not None
    assert catalog.remove_custom("my-model") is True and catalog.get_model("my-model") is None
    assert catalog.remove_custom("my-model") is False
