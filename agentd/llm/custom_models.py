"""User-defined models: validated elsewhere, kept in the catalog and persisted in the store."""

from __future__ import annotations

import threading
from typing import Any

from agentd.errors import Conflict, NotFound
from agentd.llm.catalog import CUSTOM_TIER, Catalog, ModelInfo
from agentd.store import Store

SETTING = "custom_models"


class CustomModels:
    """Adds and removes models at runtime and keeps them across restarts."""

    def __init__(self, store: Store, catalog: Catalog) -> None:
        self.store = store
        self.catalog = catalog
        self._lock = threading.Lock()
        for data in store.get_setting(SETTING, []) or []:
            self.catalog.add_custom(self._info(data))

    @staticmethod
    def _info(data: dict[str, Any]) -> ModelInfo:
        # (Models stored before the tier was kept have none: they were `custom`.)
        return ModelInfo(aliases=[], **{"tier": CUSTOM_TIER, **data})

    def add(self, data: dict[str, Any]) -> str:
        """Add a model (of the tier it names, `custom` by default); 409 when the id is taken."""
        with self._lock:
            if self.catalog.get_model(data["id"]) is not None:
                raise Conflict(f"a model with id {data['id']!r} already exists")
            self.catalog.add_custom(self._info(data))
            stored = [m for m in self.store.get_setting(SETTING, []) or [] if m["id"] != data["id"]]
            stored.append(data)
            self.store.set_setting(SETTING, stored)
        return data["id"]

    def remove(self, model_id: str) -> str:
        """Remove a custom model (its id in any case, as GET finds it) and say its id; 404 for
        unknown or built-in ids."""
        with self._lock:
            model_id = next((m.id for m in self.catalog.custom_models() if m.id.lower() == model_id.lower()), model_id)
            if not self.catalog.remove_custom(model_id):
                raise NotFound(f"custom model not found: {model_id}")
            stored = [m for m in self.store.get_setting(SETTING, []) or [] if m["id"] != model_id]
            self.store.set_setting(SETTING, stored)
        return model_id

    def follow(self) -> None:
        """Make the catalog's custom models match the stored ones, which another daemon on a
        shared database may have changed (see agentd/cluster/settings_follow.py).

        Read under the lock `add` and `remove` hold while they write: a read taken before
        one of them committed would otherwise undo the model it just added."""
        with self._lock:
            wanted = {m["id"]: m for m in self.store.get_setting(SETTING, []) or []}
            for info in self.catalog.custom_models():
                data = wanted.get(info.id)
                if data is None or self._info(data) != info:
                    self.catalog.remove_custom(info.id)
            for model_id, data in wanted.items():
                if self.catalog.get_model(model_id) is None:
                    self.catalog.add_custom(self._info(data))
