"""Persistence: one Pony `Database` holding every entity."""

from agentd.store.db import Store, StoreError, open_store

__all__ = ["Store", "StoreError", "open_store"]
