"""Which provider, model, key variable and base URL a manifest's `[model]` table means."""

from __future__ import annotations

from agentd.agents.manifest import Manifest
from agentd.config import Config
from agentd.llm.catalog import Catalog


def resolve_model(config: Config, catalog: Catalog, manifest: Manifest) -> tuple[str, str, str, str]:
    """(provider, model id, api_key_env, base_url), the daemon's default model filling what
    the manifest leaves unset and the catalog turning aliases into model ids."""
    spec = manifest.model
    default = config.default_model
    provider, model = spec["provider"], spec["model"]
    api_key_env, base_url = spec["api_key_env"], spec["base_url"]
    provider_unset = provider in ("", "default")
    if provider_unset:
        # A catalog model (or alias) named without a provider is served by its own provider:
        # `model = "sonnet"` is Anthropic's, not the default provider's.
        info = catalog.get_model(model) if model not in ("", "default") else None
        if info is not None and info.provider != default.provider:
            return info.provider, info.id, api_key_env, base_url
    if provider_unset or model in ("", "default"):
        provider = default.provider if provider_unset else provider
        model = default.model if model in ("", "default") else model
        api_key_env = api_key_env or default.api_key_env
        base_url = base_url or default.base_url
    for sep in ("/", ":"):
        prefix = provider + sep
        if model.startswith(prefix) and catalog.get_model(model) is None:
            model = model[len(prefix):]
    info = catalog.get_model(model)
    if info is not None:
        model = info.id
    return provider, model, api_key_env, base_url
