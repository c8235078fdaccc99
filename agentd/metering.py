"""Usage metering: every model call is recorded with tokens and cost."""

from __future__ import annotations

import threading

from pony import orm

from agentd.kernel_time import utcnow
from agentd.llm.catalog import Catalog
from agentd.store import Store


class Metering:
    """Records model calls in the store and prices them from the catalog."""

    def __init__(self, store: Store, catalog: Catalog) -> None:
        self.store = store
        self.catalog = catalog
        self.enabled = True
        self._lock = threading.Lock()

    def record(self, agent_id: str, agent_name: str, provider: str, model: str,
               input_tokens: int, output_tokens: int) -> float | None:
        """Persist one call; returns its cost in USD (None when the model has no price)."""
        cost = self.catalog.cost_usd(model, input_tokens, output_tokens)
        if not self.enabled:
            return cost
        with orm.db_session:
            self.store.e.UsageRow(agent_id=agent_id, agent_name=agent_name, provider=provider,
                                  model=model, input_tokens=input_tokens, output_tokens=output_tokens,
                                  cost_usd=cost or 0.0, priced=cost is not None, at=utcnow())
        return cost
