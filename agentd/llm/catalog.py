"""The model and provider catalog: built-in data files plus custom models added at runtime."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

TIERS = ("frontier", "smart", "balanced", "fast", "local", "custom")


@dataclass(frozen=True)
class ProviderInfo:
    """One LLM provider; `kind` names the wire format (openai, anthropic, gemini)."""

    id: str
    display_name: str
    api_key_env: str
    base_url: str
    key_required: bool
    kind: str


@dataclass
class ModelInfo:
    """One model, with the spec's Model fields."""

    id: str
    display_name: str
    provider: str
    tier: str
    context_window: int
    max_output_tokens: int
    input_cost_per_m: float
    output_cost_per_m: float
    supports_tools: bool
    supports_vision: bool
    supports_streaming: bool
    aliases: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The API shape (exactly the spec's fields)."""
        return asdict(self)


@dataclass(frozen=True)
class _Builtin:
    providers: tuple[ProviderInfo, ...]
    models: tuple[ModelInfo, ...]
    aliases: dict[str, str]


@lru_cache(maxsize=1)
def _builtin() -> _Builtin:
    """Parse the packaged data once per process; every Catalog shares it read-only."""
    data = resources.files("agentd.data")

    def read(name: str) -> Any:
        return json.loads(data.joinpath(name).read_text(encoding="utf-8"))

    providers = tuple(ProviderInfo(**p) for p in read("providers.json"))
    models = tuple(ModelInfo(**m) for m in read("models.json"))
    return _Builtin(providers, models, read("aliases.json"))


class Catalog:
    """Lookups by id, alias or `provider/model`; custom models are per instance."""

    def __init__(self, builtin: _Builtin) -> None:
        self._builtin = builtin
        self._providers = {p.id.lower(): p for p in builtin.providers}
        self._custom: dict[str, ModelInfo] = {}
        self._lock = threading.Lock()
        self._index: dict[str, ModelInfo] = {}
        self._reindex()

    @classmethod
    def load(cls) -> "Catalog":
        """The built-in catalog, with no custom models yet."""
        return cls(_builtin())

    def _reindex(self) -> None:
        # Rebuilt whole on every custom change (rare); lookups then stay single dict hits.
        index: dict[str, ModelInfo] = {}
        by_id = {m.id: m for m in self._builtin.models}
        for alias, target in self._builtin.aliases.items():
            index[alias] = by_id[target]
        for model in (*self._builtin.models, *self._custom.values()):
            index.setdefault(model.id.lower(), model)
        for model in (*self._builtin.models, *self._custom.values()):
            index[model.id] = model
        self._index = index

    # -- providers -------------------------------------------------------------
    def providers(self) -> list[ProviderInfo]:
        """Every provider, in data-file order."""
        return list(self._builtin.providers)

    def get_provider(self, provider_id: str) -> ProviderInfo | None:
        return self._providers.get(str(provider_id).lower())

    # -- models ------------------------------------------------------------------
    def models(self, provider: str | None = None, tier: str | None = None) -> list[ModelInfo]:
        """Built-in models then custom ones, optionally filtered (case-insensitive)."""
        out = [*self._builtin.models, *self._custom.values()]
        if provider:
            out = [m for m in out if m.provider.lower() == provider.lower()]
        if tier:
            out = [m for m in out if m.tier == tier.lower()]
        return out

    def get_model(self, id_or_alias: str) -> ModelInfo | None:
        """Exact id, then case-insensitive id or alias, then `provider/id` or `provider:id`."""
        index = self._index
        found = index.get(id_or_alias) or index.get(id_or_alias.lower())
        if found is not None:
            return found
        for sep in ("/", ":"):
            provider, _, rest = id_or_alias.partition(sep)
            if rest and provider.lower() in self._providers:
                model = index.get(rest) or index.get(rest.lower())
                if model is not None and model.provider.lower() == provider.lower():
                    return model
        return None

    def resolve(self, name: str) -> str:
        """The canonical id for an id or alias; unknown names pass through unchanged."""
        model = self.get_model(name)
        return model.id if model is not None else name

    def aliases(self) -> dict[str, str]:
        return dict(self._builtin.aliases)

    def model_count(self, provider_id: str) -> int:
        return len(self.models(provider=provider_id))

    # -- custom models -------------------------------------------------------
    def add_custom(self, info: ModelInfo) -> None:
        """Register a runtime model (the caller has checked the id is free)."""
        with self._lock:
            self._custom[info.id] = info
            self._reindex()

    def remove_custom(self, model_id: str) -> bool:
        """Remove a custom model; False when `model_id` is not one (built-ins stay)."""
        with self._lock:
            if self._custom.pop(model_id, None) is None:
                return False
            self._reindex()
            return True

    # -- cost ------------------------------------------------------------------
    def cost_usd(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """The spec's formula with current prices; None for a model the catalog does not know."""
        info = self.get_model(model)
        if info is None:
            return None
        return round((input_tokens * info.input_cost_per_m + output_tokens * info.output_cost_per_m) / 1e6, 10)
