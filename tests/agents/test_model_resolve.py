"""Which provider, model, key variable and base URL a manifest's `[model]` table means
(agentd/agents/model_resolve.py), called directly with the default config and the real
catalog. (The table of cases through a real manager's spawn: tests/agents/test_registry.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd.agents.manifest import parse_manifest
from agentd.agents.model_resolve import resolve_model
from agentd.config import parse_config
from agentd.llm.catalog import Catalog, ModelInfo

DEFAULT = ("anthropic", "claude-sonnet-4-20250514", "ANTHROPIC_API_KEY", "")


def custom(model_id: str, provider: str, aliases: list[str] | None = None) -> ModelInfo:
    return ModelInfo(id=model_id, display_name=model_id, provider=provider, tier="custom", context_window=8192,
                     max_output_tokens=1024, input_cost_per_m=0.0, output_cost_per_m=0.0, supports_tools=True,
                     supports_vision=False, supports_streaming=True, aliases=aliases or [])


@pytest.fixture()
def resolve(tmp_path: Path):
    config = parse_config({}, tmp_path)
    catalog = Catalog.load()

    def resolve(table: str) -> tuple[str, str, str, str]:
        return resolve_model(config, catalog, parse_manifest(f'name = "m"\n[model]\n{table}'))

    resolve.catalog = catalog  # type: ignore[attr-defined]
    return resolve


def test_default_means_the_daemons_model_even_beside_a_custom_model_of_that_name(resolve) -> None:
    assert resolve('provider = "default"\nmodel = "default"\n') == DEFAULT
    # A custom model whose id (or alias) is "default" does not take the word's meaning over.
    resolve.catalog.add_custom(custom("default", "groq"))
    resolve.catalog.add_custom(custom("groq-own", "groq", aliases=["DEFAULT"]))
    assert resolve('provider = "default"\nmodel = "default"\n') == DEFAULT
    assert resolve('provider = ""\nmodel = "default"\n') == DEFAULT
    assert resolve('provider = "default"\nmodel = ""\n') == DEFAULT


def test_a_custom_model_named_without_a_provider_is_its_own_providers(resolve) -> None:
    resolve.catalog.add_custom(custom("groq-own", "groq", aliases=["mine"]))
    assert resolve('provider = "default"\nmodel = "mine"\n') == ("groq", "groq-own", "", "")
    assert resolve('provider = "default"\nmodel = "mine"\napi_key_env = "K"\nbase_url = "http://h/v1"\n') == \
        ("groq", "groq-own", "K", "http://h/v1")


def test_an_own_key_and_url_are_kept_when_the_model_is_the_default(resolve) -> None:
    assert resolve('provider = "openai"\nmodel = "default"\napi_key_env = "K"\nbase_url = "http://h/v1"\n') == \
        ("openai", "claude-sonnet-4-20250514", "K", "http://h/v1")
    assert resolve('provider = "default"\nmodel = "my-own"\napi_key_env = "K"\n') == \
        ("anthropic", "my-own", "K", "")
