"""agentd: a local daemon that hosts autonomous LLM agents."""

__version__ = "0.1.0"
