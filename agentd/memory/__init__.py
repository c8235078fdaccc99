"""Per-agent memory: key-value (kv.py), semantic memory and the knowledge graph (service.py)."""
