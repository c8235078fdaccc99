"""Workflows: multi-agent pipelines (definition checks, the engine, run records)."""

from agentd.workflows.engine import WorkflowEngine

__all__ = ["WorkflowEngine"]
