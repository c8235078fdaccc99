"""Agent registry and message dispatch: spawn, list, message, stop, kill, sessions.

Agents live in memory for speed and in the store for durability; every change
is written through before the call returns.

AgentManager is assembled from one module per job:
- registry.py: loading, spawning, lookup, views, mode changes and kill;
- session_store.py: sessions (cache, append, clear, compact);
- model_call.py: provider endpoints and the model call with fallbacks;
- runner.py: run execution and queueing (quota, user turn, run, submit/wait/stop);
- uploads.py: uploaded files; ops.py: what tools may do to other agents;
- handle.py (AgentHandle, RunOptions, limits) and run_errors.py (AgentRunError).
Everything those modules define that other code imports is re-exported here.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from agentd.agents.approvals import ApprovalQueue
from agentd.agents.handle import (CAPABILITY_TOOLS, COMPACT_KEEP, MESSAGE_LIMIT, MODES, STOPPED_NOTE,
                                  UPLOAD_LIMIT, UPLOAD_TYPES, AgentHandle, RunOptions, parse_uuid)
from agentd.agents.model_call import ModelCalls
from agentd.agents.ops import AgentOpsImpl
from agentd.agents.registry import AgentRegistry
from agentd.agents.run_errors import AgentRunError, run_error
from agentd.agents.runner import RunExecution
from agentd.agents.runqueue import RunQueues
from agentd.agents.session_store import SessionStore
from agentd.agents.uploads import Uploads
from agentd.config import Config
from agentd.llm.catalog import Catalog
from agentd.llm.types import ChatResponse
from agentd.memory.kv import KvMemory
from agentd.store import Store

__all__ = ["AgentHandle", "AgentManager", "AgentOpsImpl", "AgentRunError", "CAPABILITY_TOOLS", "COMPACT_KEEP",
           "MESSAGE_LIMIT", "MODES", "RunOptions", "STOPPED_NOTE", "UPLOAD_LIMIT", "UPLOAD_TYPES",
           "parse_uuid", "run_error"]


class AgentManager(AgentRegistry, SessionStore, ModelCalls, RunExecution, Uploads):
    """Owns every agent; the kernel exposes it to the API.

    Each job lives in its own module (see the module docstring); this class holds the
    state they share."""

    def __init__(self, config: Config, store: Store, catalog: Catalog, kv: KvMemory,
                 approvals: ApprovalQueue, executor: ThreadPoolExecutor,
                 record_usage: Callable[[AgentHandle, str, str, ChatResponse], float | None],
                 preflight: Callable[[AgentHandle], None] | None = None) -> None:
        self.config = config
        self.store = store
        self.catalog = catalog
        self.kv = kv
        self.approvals = approvals
        self.executor = executor
        self.record_usage = record_usage
        self.preflight = preflight
        self._agents: dict[str, AgentHandle] = {}
        self._by_name: dict[str, str] = {}
        # Agents this daemon is killing: dropped from `_agents` before their rows are deleted,
        # so a lookup in between must not adopt them back from the row (agents/shared.py).
        self._killing: set[str] = set()
        self._lock = threading.RLock()
        # agentd.memory.service.MemoryService, set by the kernel: recall before model calls,
        # auto-remember after runs, cleanup on kill.
        self.memory: Any = None
        # Provider base URLs set at runtime (PUT /api/providers/{name}/url) win over config.
        self.url_overrides: dict[str, str] = {}
        self.queues = RunQueues(executor, lambda: self.config.agents.max_queue,
                                lambda h, job: self.run(h, job.text, job.attachments, job.emit, job.options,
                                                        None, job.cancel))
        # The kernel's audit trail: audit_hook(event, subject, detail) on spawn, kill and
        # refused manifest signatures.
        self.audit_hook: Callable[[str, str, dict[str, Any]], None] | None = None
        # Set by the kernel (Metering.write_rows): a run's usage rows are then collected and
        # written in the transaction that saves its session (one commit per run).
        self.write_usage: Callable[[Any, list[dict[str, Any]]], None] | None = None  # (tx, rows)
        # agentd.cluster.Cluster, set by the kernel: run leases and run records shared with
        # other daemons on the same database (agentd/cluster.py).
        self.cluster: Any = None

    # -- operations tools use ---------------------------------------------------------
    def ops_for(self, handle: AgentHandle) -> "AgentOpsImpl":
        return AgentOpsImpl(self)
