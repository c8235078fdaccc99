"""First run: whether the daemon still needs a provider, and which local servers answer.

A fresh home's default provider (Anthropic) has no key, so no message can be answered
until a key is set or the default model points at a provider that works. The dashboard's
setup page reads `needed()` and offers the local OpenAI-compatible servers
(`detect_local()`) that answer on their catalogue addresses.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentd.config import Config
from agentd.llm.catalog import Catalog, ProviderInfo
from agentd.providers import ProviderKeys

# A local server answers within milliseconds; the page must not wait on one that does not.
PROBE_TIMEOUT = 0.5


class FirstRun:
    """Setup state over the providers' keys and URLs (`kernel.first_run`)."""

    def __init__(self, config: Config, catalog: Catalog, providers: ProviderKeys) -> None:
        self.config = config
        self.catalog = catalog
        self.providers = providers

    def default_provider(self) -> ProviderInfo | None:
        return self.catalog.get_provider(self.config.default_model.provider)

    def needed(self) -> bool:
        """True while the default model's provider cannot be called (its key is missing)."""
        info = self.default_provider()
        if info is None:
            return False  # a custom endpoint set in config.toml: the operator chose it
        return self.providers.auth_status(info) == "missing"

    def local_providers(self) -> list[ProviderInfo]:
        """Providers that run on this machine: no key, a loopback catalogue address."""
        return [p for p in self.catalog.providers()
                if not p.key_required and not p.api_key_env and ("localhost" in p.base_url
                                                                  or "127.0.0.1" in p.base_url)]

    def detect_local(self) -> list[dict[str, Any]]:
        """Each local provider with its address and whether it answers there now."""
        local = self.local_providers()
        if not local:
            return []
        with ThreadPoolExecutor(max_workers=len(local), thread_name_prefix="agentd-probe") as pool:
            answers = list(pool.map(self._answers, [self.providers.base_url(p) for p in local]))
        return [{"id": p.id, "display_name": p.display_name, "base_url": self.providers.base_url(p),
                 "answering": ok} for p, ok in zip(local, answers)]

    @staticmethod
    def _answers(base_url: str) -> bool:
        import requests  # loads with the first setup page, not at start

        try:
            return requests.get(f"{base_url}/models", timeout=PROBE_TIMEOUT).status_code < 500
        except requests.RequestException:
            return False
