"""Per-agent memory: key-value (semantic memory and the graph come later)."""
