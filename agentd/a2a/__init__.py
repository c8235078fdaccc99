"""A2A (Agent2Agent): agent cards, the JSON-RPC methods mapped onto agent runs, and the
client the a2a_* tools use (docs/a2a.md)."""
