"""The in-memory side of an agent (AgentHandle), per-request run options and the limits
shared by the agent modules and the API."""

from __future__ import annotations

import collections
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from agentd.agents.manifest import Manifest
from agentd.errors import BadRequest
from agentd.llm.types import GenerationParams, ImagePart


MODES = ("Auto", "Manual", "Observe")
MESSAGE_LIMIT = 64 * 1024
UPLOAD_LIMIT = 10 * 1024 * 1024
UPLOAD_TYPES = ("image/", "text/", "audio/", "application/pdf")
COMPACT_KEEP = 10
CAPABILITY_TOOLS = {"shell": {"shell_exec"}, "network": {"web_fetch", "web_search"},
                    "agent_spawn": {"agent_spawn"}}


def parse_uuid(value: str, what: str = "agent") -> str:
    """Normalise a UUID path segment; 400 when it is not one."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise BadRequest(f"invalid {what} id: {value!r} is not a UUID") from None


STOPPED_NOTE = "[run stopped before the agent answered]"


@dataclass
class AgentHandle:
    """The in-memory side of one agent."""

    id: str
    name: str
    manifest: Manifest
    mode: str
    state: str
    created_at: datetime
    last_active: datetime
    session_id: str
    provider: str
    model: str
    api_key_env: str
    base_url: str
    # The scoped API key that spawned the agent or last changed its manifest ("": the admin):
    # the key its manifest's jobs and triggers act as (agentd/key_runs.py).
    key_id: str = ""
    run_lock: threading.Lock = field(default_factory=threading.Lock)
    cancel: threading.Event | None = None
    # The cancel event of the queued run this agent's queue has started, set before the run
    # takes run_lock, so a stop in between (precheck, a slow first commit) still reaches it.
    starting: threading.Event | None = None
    # The cancel events of the runs going on in the agent's other sessions (a person's, a
    # named one, a channel conversation's), by session id: a stop names the session it ends.
    session_runs: dict[str, set[threading.Event]] = field(default_factory=dict)
    token_log: collections.deque = field(default_factory=collections.deque)
    killed: bool = False
    # The latest stored messages of the session (at most the history window), once read: a
    # run needs only the window, so memory per agent stays bounded however long the
    # conversation grows. Every write updates it.
    session_tail: list[dict[str, Any]] | None = None
    # The window's messages as the model gets them, by the stored dict each came from
    # (SessionStore._history): a stored message is turned into a `Message` once, not on
    # every run that sends it again. Entries: (the dict, its Message, has tool calls).
    llm_tail: dict[int, tuple[dict[str, Any], Any, bool]] = field(default_factory=dict)
    # The session whose `sessions` row this process's message writes have made sure of.
    session_row: str = ""
    # A manifest another daemon saved that this one could not read (agentd/agents/shared.py):
    # refused and logged once, not again at every lookup while the row holds it.
    unreadable_manifest: str = ""
    # The agent's workspace directory, once a run has needed it (names never change).
    workspace: Path | None = None
    # Requests waiting for this agent: they hold no run-pool worker while they wait.
    waiting: collections.deque = field(default_factory=collections.deque)
    busy: bool = False
    queue_lock: threading.Lock = field(default_factory=threading.Lock)
    # (manifest, what the item showed, its JSON text) of this agent's GET /api/agents item
    # (agents/listing.py).
    list_json: tuple[Any, tuple[Any, ...], str] | None = None
    # (manifest, mode, tools, capabilities) of the last AgentRegistry.effective_tools answer.
    tools_cache: tuple[Any, str, list[Any], dict[str, Any]] | None = None


@dataclass
class ConversationSession:
    """Another session of an agent (a channel conversation's), as a run reads and writes it:
    the same cache fields the handle keeps for the agent's own session, empty at first
    (the window is read from the session's rows)."""

    session_id: str
    session_tail: list[dict[str, Any]] | None = None
    llm_tail: dict[int, tuple[dict[str, Any], Any, bool]] = field(default_factory=dict)
    session_row: str = ""


@dataclass
class RunOptions:
    """Per-request overrides (the OpenAI-compatible API passes these)."""

    max_tokens: int | None = None
    temperature: float | None = None
    extra_system: str = ""
    # Another model of the agent's provider for this run only (a channel's override).
    model: str = ""
    images: list[ImagePart] = field(default_factory=list)
    params: GenerationParams = field(default_factory=GenerationParams)
    # Who asked, kept on the session's user message when not a person (`cron`: a cron job).
    source: str = ""
