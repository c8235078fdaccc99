"""Agent registry and message dispatch: spawn, list, message, stop, kill, sessions.

Agents live in memory for speed and in the store for durability; every change
is written through before the call returns.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from pony import orm

from agentd.agents import shared
from agentd.agents.approvals import ApprovalQueue
from agentd.agents.events import Event, Sink
from agentd.agents.loop import AgentLoop, LoopStopped, RunCancelled, RunResult, RunSpec
from agentd.agents.manifest import PROFILES, Manifest, parse_manifest
from agentd.agents.runqueue import QueuedRun, RunQueues
from agentd.agents.session import api_view, clean_history, estimate_tokens, to_llm, to_stored
from agentd.agents.signing import verify_envelope
from agentd.agents.tools import Tool, ToolContext, ToolError, all_tools
from agentd.config import Config
from agentd.errors import AgentdError, BadRequest, Conflict, NotFound, TooManyRequests
from agentd.kernel_time import iso, utcnow
from agentd.llm import drivers
from agentd.llm.catalog import Catalog
from agentd.llm.types import ChatRequest, ChatResponse, ImagePart, LLMError, Message, ProviderEndpoint
from agentd.llm.types import GenerationParams
from agentd.memory.kv import KvMemory
from agentd.store import Store

log = logging.getLogger("agentd.agents")

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


class AgentRunError(AgentdError):
    """A run failed; the message says which provider/model/tool and why.

    `kind` is the LLMError kind that ended it (missing_key, auth, rate_limit, server,
    timeout, unreachable, bad_request, reset, truncated, ...) or `loop_guard`;
    `http_status` the provider's own status when it answered one; `provider`/`model`
    the call that failed; `retryable` whether sending the same request again may
    succeed. The API layers map them to their conventions; `status` is the native one.
    """

    status = 500

    def __init__(self, message: str, *, retry_after: float | None = None, kind: str = "server",
                 http_status: int | None = None, status: int | None = None, provider: str = "",
                 model: str = "", retryable: bool = False) -> None:
        super().__init__(message, status=status, retry_after=retry_after)
        self.kind = kind
        self.http_status = http_status
        self.provider = provider
        self.model = model
        self.retryable = retryable


# What the client gets for a model call that failed this way (everything else: 500).
_RUN_STATUS = {"timeout": 504, "rate_limit": 429, "reset": 502, "truncated": 502}


def run_error(exc: LLMError, prefix: str = "message delivery failed") -> AgentRunError:
    """The client-facing error of a failed model call: 504 timeout, upstream 429/503 kept
    (with Retry-After), 502 for a reset connection or a cut-off stream."""
    status = _RUN_STATUS.get(exc.kind, 500)
    if exc.kind == "server" and exc.http_status == 503:
        status = 503
    return AgentRunError(f"{prefix}: {exc.message}", status=status, retry_after=exc.retry_after,
                         kind=exc.kind, http_status=exc.http_status, provider=exc.provider,
                         model=exc.model, retryable=exc.retryable)


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
    run_lock: threading.Lock = field(default_factory=threading.Lock)
    cancel: threading.Event | None = None
    token_log: collections.deque = field(default_factory=collections.deque)
    killed: bool = False
    # The session's stored messages, once read; every write replaces it.
    session_cache: list[dict[str, Any]] | None = None
    # The same messages converted for the model, extended as runs append (long sessions
    # would otherwise be converted again on every message).
    llm_history: list[Message] | None = None
    # Requests waiting for this agent: they hold no run-pool worker while they wait.
    waiting: collections.deque = field(default_factory=collections.deque)
    busy: bool = False
    queue_lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class RunOptions:
    """Per-request overrides (the OpenAI-compatible API passes these)."""

    max_tokens: int | None = None
    temperature: float | None = None
    extra_system: str = ""
    images: list[ImagePart] = field(default_factory=list)
    params: GenerationParams = field(default_factory=GenerationParams)


class AgentManager:
    """Owns every agent; the kernel exposes it to the API."""

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
        # agentd.cluster.Cluster, set by the kernel: run leases and run records shared with
        # other daemons on the same database (agentd/cluster.py).
        self.cluster: Any = None

    # -- loading and spawning ---------------------------------------------
    def load(self) -> int:
        """Bring persisted agents back (same ids, mode and session)."""
        with orm.db_session:
            rows = list(self.store.e.AgentRow.select())
            for row in rows:
                try:
                    manifest = parse_manifest(row.manifest_toml)
                except AgentdError as exc:
                    log.error("agent %s (%s) has an unreadable manifest: %s", row.name, row.id, exc.message)
                    continue
                # SQLite hands datetimes back naive; they were written as UTC.
                handle = self._handle(row.id, manifest, row.mode, row.created_at.replace(tzinfo=timezone.utc),
                                      row.session_id)
                handle.last_active = row.last_active.replace(tzinfo=timezone.utc)
                self._register(handle)
        return len(self._agents)

    def _resolve_model(self, manifest: Manifest) -> tuple[str, str, str, str]:
        spec = manifest.model
        default = self.config.default_model
        provider, model = spec["provider"], spec["model"]
        api_key_env, base_url = spec["api_key_env"], spec["base_url"]
        if provider in ("", "default") or model in ("", "default"):
            provider = default.provider if provider in ("", "default") else provider
            model = default.model if model in ("", "default") else model
            api_key_env = api_key_env or default.api_key_env
            base_url = base_url or default.base_url
        for sep in ("/", ":"):
            prefix = provider + sep
            if model.startswith(prefix) and self.catalog.get_model(model) is None:
                model = model[len(prefix):]
        info = self.catalog.get_model(model)
        if info is not None:
            model = info.id
        return provider, model, api_key_env, base_url

    def _handle(self, agent_id: str, manifest: Manifest, mode: str, created_at: datetime,
                session_id: str) -> AgentHandle:
        provider, model, env, base = self._resolve_model(manifest)
        return AgentHandle(id=agent_id, name=manifest.name, manifest=manifest, mode=mode,
                           state="Running", created_at=created_at, last_active=created_at,
                           session_id=session_id, provider=provider, model=model,
                           api_key_env=env, base_url=base)

    def _register(self, handle: AgentHandle) -> None:
        with self._lock:
            self._agents[handle.id] = handle
            self._by_name[handle.name] = handle.id

    def spawn(self, manifest_toml: str | None, signed_manifest: str | None = None) -> AgentHandle:
        """Validate, persist and register a new agent."""
        if signed_manifest is not None:
            try:
                manifest_toml = verify_envelope(signed_manifest, manifest_toml)
            except AgentdError as exc:
                if self.audit_hook is not None:
                    self.audit_hook("agent.signature_rejected", "", {"error": exc.message[:200]})
                raise
        if not manifest_toml or not manifest_toml.strip():
            raise BadRequest("manifest_toml is required")
        manifest = parse_manifest(manifest_toml)
        now = utcnow()
        handle = self._handle(str(uuid.uuid4()), manifest, "Auto", now, str(uuid.uuid4()))
        if self.catalog.get_provider(handle.provider) is None and not handle.base_url:
            raise BadRequest(f"invalid manifest format: model.provider: unknown provider "
                             f"{handle.provider!r} (set model.base_url for a custom endpoint)")
        if self.store.shared:
            shared.sync_agent(self, name=manifest.name)
        with self._lock:
            if manifest.name in self._by_name:
                raise Conflict(f"an agent named {manifest.name!r} already exists")
            try:
                with orm.db_session:
                    row = self.store.e.AgentRow(id=handle.id, name=handle.name, manifest_toml=manifest_toml,
                                                manifest=manifest.data, mode=handle.mode, state=handle.state,
                                                created_at=now, last_active=now, session_id=handle.session_id)
                    self.store.e.SessionRow(id=handle.session_id, agent=row, messages="[]", created_at=now)
            except orm.TransactionIntegrityError:
                # Another daemon on the shared database spawned this name a moment ago.
                raise Conflict(f"an agent named {manifest.name!r} already exists") from None
            self._register(handle)
        log.info("spawned agent %s (%s) on %s/%s", handle.name, handle.id, handle.provider, handle.model)
        for warning in manifest.warnings:
            log.warning("agent %s manifest: %s", handle.name, warning)
        if self.audit_hook is not None:
            self.audit_hook("agent.spawn", handle.name, {"agent_id": handle.id})
        return handle

    # -- lookup -------------------------------------------------------------
    def get(self, agent_id: str) -> AgentHandle:
        """By UUID; 400 for a malformed id, 404 for an unknown one."""
        key = parse_uuid(agent_id)
        if self.store.shared:  # other daemons spawn and kill agents too (agents/shared.py)
            shared.sync_agent(self, agent_id=key)
        handle = self._agents.get(key)
        if handle is None or handle.killed:
            raise NotFound("agent not found")
        return handle

    def find(self, ref: str) -> AgentHandle | None:
        """By id or exact name (tools and workflows refer to agents either way)."""
        if self.store.shared:
            try:
                shared.sync_agent(self, agent_id=str(uuid.UUID(ref)))
            except (ValueError, AttributeError):
                shared.sync_agent(self, name=ref)
        try:
            handle = self._agents.get(str(uuid.UUID(ref)))
        except (ValueError, AttributeError):
            handle = None
        if handle is None:
            agent_id = self._by_name.get(ref)
            handle = self._agents.get(agent_id) if agent_id else None
        return None if handle is None or handle.killed else handle

    def by_name(self, name: str) -> AgentHandle | None:
        if self.store.shared:
            shared.sync_agent(self, name=name)
        agent_id = self._by_name.get(name)
        return self._agents.get(agent_id) if agent_id else None

    def handles(self) -> list[AgentHandle]:
        if self.store.shared:
            shared.sync_all(self)
        with self._lock:
            return sorted((h for h in self._agents.values() if not h.killed), key=lambda h: h.created_at)

    def count(self) -> int:
        return len(self._agents)

    # -- views --------------------------------------------------------------
    def auth_status(self, handle: AgentHandle) -> str:
        provider = self.catalog.get_provider(handle.provider)
        env = handle.api_key_env or (provider.api_key_env if provider else "")
        if provider is not None and not provider.key_required and not handle.api_key_env:
            return "not_required"
        if not env:
            return "not_required"
        return "configured" if os.environ.get(env) else "missing"

    def summary(self, handle: AgentHandle) -> dict[str, Any]:
        """Short form used by /api/status."""
        return {"id": handle.id, "name": handle.name, "state": handle.state, "mode": handle.mode,
                "created_at": iso(handle.created_at), "model_provider": handle.provider,
                "model_name": handle.model, "profile": handle.manifest.profile or "custom"}

    def list_item(self, handle: AgentHandle) -> dict[str, Any]:
        """One item of GET /api/agents."""
        info = self.catalog.get_model(handle.model)
        auth = self.auth_status(handle)
        identity = handle.manifest.data["identity"]
        return {"id": handle.id, "name": handle.name, "state": handle.state, "mode": handle.mode,
                "created_at": iso(handle.created_at), "last_active": iso(handle.last_active),
                "model_provider": handle.provider, "model_name": handle.model,
                "model_tier": info.tier if info else "custom", "auth_status": auth,
                "ready": handle.state == "Running" and auth != "missing",
                "profile": handle.manifest.profile or "custom",
                "identity": {"emoji": identity["emoji"], "avatar_url": identity["avatar_url"],
                             "color": identity["color"]}}

    def detail(self, handle: AgentHandle) -> dict[str, Any]:
        """GET /api/agents/{id}."""
        data = handle.manifest.data
        tools, caps = self.effective_tools(handle)
        item = self.list_item(handle)
        return {"id": handle.id, "name": handle.name, "state": handle.state, "mode": handle.mode,
                "profile": item["profile"], "created_at": item["created_at"],
                "last_active": item["last_active"], "session_id": handle.session_id,
                "model": {"provider": handle.provider, "model": handle.model},
                "capabilities": {"tools": [t.name for t in tools], "network": bool(caps["network"])},
                "description": data["description"], "tags": data["tags"],
                "identity": item["identity"], "skills": data["skills"],
                "skills_mode": "allowlist" if data["skills"] else "all",
                "mcp_servers": data["mcp_servers"],
                "mcp_servers_mode": "allowlist" if data["mcp_servers"] else "all",
                "fallback_models": data["fallback_models"],
                "system_prompt": data["model"]["system_prompt"]}

    # -- tools --------------------------------------------------------------
    def effective_tools(self, handle: AgentHandle, mode: str | None = None) -> tuple[list[Tool], dict[str, Any]]:
        """The tools offered to the model, and the capabilities that gate them.

        A named profile grants the capabilities its tools need; with no profile or
        an explicit list, shell, network and spawning must be granted explicitly.
        """
        caps = dict(handle.manifest.capabilities)
        declared = caps["tools"]
        profile = handle.manifest.profile
        available = {t.name: t for t in all_tools()}
        if declared and "*" not in declared:
            names = [n for n in declared if n in available]
        elif profile and profile not in ("full", "custom"):
            names = list(PROFILES[profile])
            self._imply(caps, names)
        else:
            names = list(available)
            if profile == "full":
                self._imply(caps, names)
        tools = [available[n] for n in names if n in available]
        tools = [t for t in tools if t.capability is None or caps.get(t.capability)]
        mode = mode or handle.mode
        if mode == "Observe":
            tools = [t for t in tools if t.read_only]
            caps["read_only_mode"] = True
        return tools, caps

    @staticmethod
    def _imply(caps: dict[str, Any], names: list[str]) -> None:
        for capability, tool_names in CAPABILITY_TOOLS.items():
            if tool_names & set(names) and not caps.get(capability):
                caps[capability] = True if capability == "agent_spawn" else ["*"]

    # -- provider endpoints ---------------------------------------------------
    def endpoint(self, provider_id: str, api_key_env: str = "", base_url: str = "") -> ProviderEndpoint:
        """Where and how to call `provider_id`, with the key read from the environment now."""
        info = self.catalog.get_provider(provider_id)
        if info is None and not base_url:
            raise LLMError(f"{provider_id}: unknown provider", provider=provider_id, model="",
                           kind="bad_request")
        url = (base_url or self.url_overrides.get(provider_id)
               or self.config.provider_urls.get(provider_id) or (info.base_url if info else ""))
        env = api_key_env or (info.api_key_env if info else "")
        return ProviderEndpoint(provider=provider_id, kind=info.kind if info else "openai",
                                base_url=url, api_key=os.environ.get(env, "") if env else "",
                                api_key_env=env, timeout=self.config.llm.timeout_secs,
                                stream_idle=self.config.llm.stream_idle_secs,
                                key_required=(info.key_required if info else bool(env)) or bool(api_key_env))

    def _llm_call(self, handle: AgentHandle) -> Callable[..., ChatResponse]:
        chain = [(handle.provider, handle.model, handle.api_key_env, handle.base_url)]
        for fb in handle.manifest.data["fallback_models"]:
            chain.append((fb["provider"], self.catalog.resolve(fb["model"]), fb["api_key_env"], fb["base_url"]))

        def call(request: ChatRequest, on_event: Callable[[Any], None] | None,
                 cancel: threading.Event) -> ChatResponse:
            errors: list[LLMError] = []
            # One deadline for the call, fallbacks included.
            deadline = time.monotonic() + self.config.llm.timeout_secs
            for provider, model, env, base in chain:
                delivered = [False]

                def forward(event: Any) -> None:
                    delivered[0] = True
                    on_event(event)  # type: ignore[misc]

                try:
                    endpoint = self.endpoint(provider, env, base)
                    response = drivers.complete(endpoint, replace(request, model=model),
                                                on_event=forward if on_event else None, cancel=cancel,
                                                retries=self.config.llm.retries, deadline=deadline)
                except LLMError as exc:
                    if exc.kind in ("cancelled", "timeout") or delivered[0]:
                        raise
                    errors.append(exc)
                    log.warning("model call failed: %s", exc.message)
                    continue
                response.model = model
                cost = self.record_usage(handle, provider, model, response)
                response.cost_usd = cost  # type: ignore[attr-defined]
                return response
            if len(errors) == 1:
                raise errors[0]
            raise LLMError("all models failed: " + "; ".join(e.message for e in errors),
                           provider=errors[0].provider, model=errors[0].model, kind=errors[-1].kind,
                           http_status=errors[-1].http_status, retry_after=errors[-1].retry_after)

        return call

    # -- quotas -----------------------------------------------------------------
    def _check_quota(self, handle: AgentHandle) -> None:
        limit = handle.manifest.tokens_per_hour
        if not limit:
            return
        now = time.time()
        log_ = handle.token_log
        while log_ and log_[0][0] <= now - 3600:
            log_.popleft()
        used = sum(n for _, n in log_)
        if used >= limit:
            retry = int(log_[0][0] + 3600 - now) + 1 if log_ else 60
            raise TooManyRequests(
                f"message delivery failed: quota exceeded: {used} of {limit} LLM tokens used in the "
                "last hour (max_llm_tokens_per_hour)", retry_after=retry)

    # -- running ------------------------------------------------------------------
    def build_user_message(self, handle: AgentHandle, text: str, attachments: list[dict[str, Any]],
                           images: list[ImagePart] | None = None) -> tuple[Message, list[dict[str, Any]]]:
        """The user turn: text, attached text files inline, images as base64 parts."""
        parts = [text]
        image_parts = list(images or [])
        refs: list[dict[str, Any]] = []
        for att in attachments:
            upload = self._upload(handle, att.get("file_id", ""))
            ctype = upload["content_type"]
            data = upload["data"]
            if ctype.startswith("image/"):
                image_parts.append(ImagePart(ctype, base64.b64encode(data).decode("ascii")))
                refs.append({"file_id": upload["id"], "filename": upload["filename"], "content_type": ctype})
            elif ctype.startswith("text/"):
                parts.append(f"\n[attached file {upload['filename']}]\n{data.decode('utf-8', 'replace')}")
            else:
                parts.append(f"\n[attached file {upload['filename']} ({ctype}, {len(data)} bytes); "
                             "its content cannot be shown to the model]")
        if image_parts:
            info = self.catalog.get_model(handle.model)
            if info is not None and not info.supports_vision:
                raise BadRequest(f"model {handle.model} does not support images; "
                                 "use a vision-capable model or send text only")
        return Message(role="user", content="".join(parts), images=image_parts), refs

    def run(self, handle: AgentHandle, text: str, attachments: list[dict[str, Any]] | None = None,
            emit: Sink | None = None, options: RunOptions | None = None,
            lock_timeout: float | None = None, cancel: threading.Event | None = None) -> RunResult:
        """Run one message to completion in the calling thread.

        `cancel` lets the caller stop the run; stop() and kill() set it too.
        """
        options = options or RunOptions()
        self.precheck(handle)
        user, image_refs = self.build_user_message(handle, text, attachments or [], options.images)
        acquired = handle.run_lock.acquire(timeout=-1 if lock_timeout is None else lock_timeout)
        if not acquired:
            raise Conflict(f"agent {handle.name} is busy with another run")
        cancel = cancel or threading.Event()
        started = time.monotonic()
        try:
            if handle.killed or cancel.is_set():
                raise RunCancelled("run cancelled")
            handle.cancel = cancel
            if self.cluster is not None:
                return self.cluster.run(handle, cancel, lock_timeout,
                                        lambda: self._run_locked(handle, user, image_refs, emit, options, cancel))
            return self._run_locked(handle, user, image_refs, emit, options, cancel)
        except RunCancelled:
            log.info("run stopped: agent=%s provider=%s model=%s duration=%.2fs", handle.name,
                     handle.provider, handle.model, time.monotonic() - started)
            raise
        except Exception as exc:
            # One line per failed run, streamed or not, whatever failed.
            cause = exc.message if isinstance(exc, AgentdError) else f"{type(exc).__name__}: {exc}"
            log.warning("run failed: agent=%s provider=%s model=%s status=%s cause=%s duration=%.2fs",
                        handle.name, getattr(exc, "provider", "") or handle.provider,
                        getattr(exc, "model", "") or handle.model, getattr(exc, "status", 500), cause,
                        time.monotonic() - started)
            raise
        finally:
            handle.cancel = None
            handle.run_lock.release()

    def _run_locked(self, handle: AgentHandle, user: Message, image_refs: list[dict[str, Any]],
                    emit: Sink | None, options: RunOptions, cancel: threading.Event) -> RunResult:
        stored = self._load_session(handle)
        tools, caps = self.effective_tools(handle)
        model_cfg = handle.manifest.model
        system = model_cfg["system_prompt"]
        if options.extra_system:
            system = f"{system}\n\n{options.extra_system}"
        if self.memory is not None:
            system = self.memory.system_context(handle.id, user.content or "", stored, system)
        workspace = self.config.workspaces_dir / handle.name
        ctx = ToolContext(agent_id=handle.id, agent_name=handle.name, workspace=workspace,
                          capabilities=caps, tools_config=self.config.tools, ops=self.ops_for(handle),
                          cancel=cancel)
        approver = None
        if handle.mode == "Manual":
            def approver(tool: str, args: dict[str, Any]) -> str:
                approval = self.approvals.request(handle.id, handle.name, tool, args)
                if emit is not None:
                    emit(Event("phase", {"phase": "awaiting_approval",
                                         "detail": f"{tool} (approval {approval.id})"}))
                return self.approvals.wait(approval, self.config.tools.approval_timeout_secs, cancel)
        costs: list[float | None] = []

        def on_usage(response: ChatResponse) -> None:
            costs.append(getattr(response, "cost_usd", None))
            handle.token_log.append((time.time(), response.usage.input_tokens + response.usage.output_tokens))

        spec = RunSpec(model=handle.model, system=system, history=self._history(handle, stored), user=user,
                       tools=tools, tool_ctx=ctx, llm=self._llm_call(handle),
                       max_iterations=handle.manifest.max_iterations,
                       tool_timeout=handle.manifest.tool_timeout,
                       max_tokens=options.max_tokens or model_cfg["max_tokens"],
                       temperature=options.temperature if options.temperature is not None
                       else model_cfg["temperature"],
                       emit=emit, approver=approver, on_usage=on_usage,
                       mode_note="Observe mode: read-only tools" if handle.mode == "Observe" else "",
                       params=options.params)
        loop = AgentLoop(spec, cancel)

        def save_unanswered(note: str) -> None:
            # A run that ends without an answer still closes its turn, so the history the
            # model sees next time never holds a user message nobody answered.
            self._save_session(handle, stored, loop.new_messages + [Message(role="assistant", content=note)],
                               image_refs)

        try:
            result = loop.run()
        except RunCancelled:
            save_unanswered(STOPPED_NOTE)
            raise
        except LLMError as exc:
            # The turn is closed with a failure note; text a cut-off stream had already
            # sent is not recorded as the reply.
            save_unanswered(f"[run failed: {exc.message}]")
            raise run_error(exc) from None
        except LoopStopped as exc:
            save_unanswered(f"[run failed: {exc.message}]")
            raise AgentRunError(f"message delivery failed: {exc.message}", kind="loop_guard") from None
        self._save_session(handle, stored, result.new_messages, image_refs)
        if self.memory is not None:
            self.memory.after_exchange(handle.id, handle.session_id, user.content or "", result.response)
        result.cost_usd = None if not costs or any(c is None for c in costs) else round(sum(costs), 10)
        return result

    def submit(self, handle: AgentHandle, text: str, attachments: list[dict[str, Any]] | None = None,
               emit: Sink | None = None, options: RunOptions | None = None,
               cancel: threading.Event | None = None) -> Future:
        """Queue a run for `handle`; different agents run in parallel on the kernel's executor,
        and a request waiting for a busy agent holds no worker (see runqueue.py)."""
        return self.queues.submit(handle, QueuedRun(text, attachments, emit, options,
                                                    cancel or threading.Event(), Future()))

    def withdraw(self, future: Future) -> bool:
        """Take a run that has not started out of its agent's queue; True if it was queued."""
        return self.queues.withdraw(future)

    def stop_all(self) -> None:
        """Shutdown: cancel every queued and running run (their provider calls close at once)."""
        for handle in list(self._agents.values()):
            self.queues.cancel_queued(handle)
            self.stop(handle)

    def wait(self, future: Future, cancel: threading.Event,
             disconnected: Callable[[], bool] | None = None) -> RunResult:
        """Wait for a submitted run; returns promptly (RunCancelled) once it is stopped, even
        while its provider call has not answered; a client that went away (`disconnected`)
        withdraws a queued run and cancels a running one."""
        return self.queues.wait(future, cancel, disconnected)

    def precheck(self, handle: AgentHandle) -> None:
        """Refusals that must happen before a response starts (quota, budget)."""
        self._check_quota(handle)
        if self.preflight is not None:
            self.preflight(handle)

    def stop(self, handle: AgentHandle) -> bool:
        """Cancel the current run; True when one was running."""
        cancel = handle.cancel
        self.approvals.cancel_agent(handle.id)
        if self.cluster is not None and self.store.shared and (cancel is None or cancel.is_set()):
            return self.cluster.request_stop(handle.id) > 0
        if cancel is None or cancel.is_set():
            return False
        cancel.set()
        return True

    def run_conversation(self, handle: AgentHandle, session_id: str, text: str,
                         label: str = "") -> RunResult:
        """Run `text` in another session of this agent (one per channel conversation).

        The run sees the agent's current manifest, mode and quota, but reads and writes
        session `session_id` (created, labelled `label`, on first use), so two
        conversations never share history. Runs of different conversations may overlap.
        """
        with orm.db_session:
            if self.store.e.SessionRow.get(id=session_id) is None:
                agent_row = self.store.e.AgentRow.get(id=handle.id)
                if agent_row is None:
                    raise NotFound("agent not found")
                self.store.e.SessionRow(id=session_id, agent=agent_row, label=label or None,
                                        messages="[]", created_at=utcnow())
        view = replace(handle, session_id=session_id, run_lock=threading.Lock(), cancel=None,
                       session_cache=None, llm_history=None, waiting=collections.deque(), busy=False,
                       queue_lock=threading.Lock())
        return self.run(view, text)

    # -- session ------------------------------------------------------------------
    def _load_session(self, handle: AgentHandle) -> list[dict[str, Any]]:
        """The stored messages; kept in memory after the first read (writes go through here too)."""
        if self.store.shared:  # another daemon may have written the session since
            handle.session_cache, handle.llm_history = None, None
        if handle.session_cache is None:
            with orm.db_session:
                row = self.store.e.SessionRow.get(id=handle.session_id)
                handle.session_cache = json.loads(row.messages or "[]") if row is not None else []
        return list(handle.session_cache)

    def _write_session(self, handle: AgentHandle, row: Any, messages: list[dict[str, Any]],
                       appended: bool = False) -> None:
        """Inside a db_session: persist `messages` and make them the cached copy.

        `appended`: `messages` is the cached session plus new messages at the end.
        """
        row.messages = json.dumps(messages, ensure_ascii=False)
        previous = handle.llm_history
        handle.session_cache = messages
        if appended and previous is not None and len(previous) <= len(messages):
            # Appended to what was cached (the usual case): convert only the new tail.
            handle.llm_history = previous + [to_llm(m) for m in messages[len(previous):]]
        else:
            handle.llm_history = None

    @staticmethod
    def _history(handle: AgentHandle, stored: list[dict[str, Any]]) -> list[Message]:
        cached = handle.llm_history
        if cached is None or len(cached) != len(stored):
            cached = handle.llm_history = [to_llm(m) for m in stored]
        return clean_history(cached)

    def _save_session(self, handle: AgentHandle, before: list[dict[str, Any]], new: list[Message],
                      image_refs: list[dict[str, Any]]) -> None:
        if handle.killed:
            return
        added = [to_stored(m) for m in new]
        if added and image_refs:
            added[0]["images"] = image_refs
        now = utcnow()
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=handle.session_id)
            agent_row = self.store.e.AgentRow.get(id=handle.id)
            if agent_row is None:
                return
            if row is None:
                row = self.store.e.SessionRow(id=handle.session_id, agent=agent_row, created_at=now)
            self._write_session(handle, row, before + added, appended=True)
            agent_row.last_active = now
        handle.last_active = now

    def session(self, handle: AgentHandle) -> dict[str, Any]:
        """GET /api/agents/{id}/session."""
        stored = self._load_session(handle)
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=handle.session_id)
            label = row.label if row is not None else None
        messages = api_view(stored)
        return {"session_id": handle.session_id, "agent_id": handle.id,
                "message_count": len(messages),
                "context_window_tokens": estimate_tokens(stored, handle.manifest.model["system_prompt"]),
                "label": label, "messages": messages}

    def delete_session(self, session_id: str) -> None:
        """Clear a session's history (the agent keeps the same session id)."""
        key = parse_uuid(session_id, "session")
        with orm.db_session:
            row = self.store.e.SessionRow.get(id=key)
            if row is None:
                raise NotFound("session not found")
            owner = self._agents.get(row.agent.id)
            row.messages = "[]"
            if owner is not None:
                owner.session_cache, owner.llm_history = [], None

    def reset_session(self, handle: AgentHandle) -> None:
        self.delete_session(handle.session_id)

    def compact(self, handle: AgentHandle) -> dict[str, Any]:
        """Summarise older messages with the agent's own model; keep the recent ones."""
        with handle.run_lock:
            stored = self._load_session(handle)
            split = len(stored) - COMPACT_KEEP
            # Never separate a tool result from the call that asked for it.
            while split > 0 and stored[split]["role"] == "tool":
                split -= 1
            if split <= 1:
                return {"status": "ok", "compacted": False, "summarized_messages": 0,
                        "kept_messages": len(stored),
                        "message": f"no compaction needed ({len(stored)} messages)"}
            older, kept = stored[:split], stored[split:]
            transcript = "\n\n".join(f"{m['role'].capitalize()}: {m.get('content', '')}"
                                     for m in older if m.get("content"))[-100_000:]
            request = ChatRequest(model=handle.model, system=(
                "You summarise conversations. Write a concise summary of the conversation below that keeps "
                "every fact, decision, name, number and open task needed to continue it."),
                messages=[Message(role="user", content=transcript)], max_tokens=1024, temperature=0.3)
            try:
                response = self._llm_call(handle)(request, None, threading.Event())
            except LLMError as exc:
                raise AgentRunError(f"compaction failed: {exc.message}", kind=exc.kind,
                                    http_status=exc.http_status) from None
            from agentd.llm.think import strip_think

            summary = strip_think(response.text).strip() or "(empty summary)"
            new = [{"role": "user", "content": f"[Summary of the earlier conversation]\n{summary}"}] + kept
            with orm.db_session:
                row = self.store.e.SessionRow.get(id=handle.session_id)
                self._write_session(handle, row, new)
        return {"status": "ok", "compacted": True, "summarized_messages": len(older),
                "kept_messages": len(kept),
                "message": f"compacted {len(older)} messages into a summary of {len(summary)} chars, "
                           f"kept {len(kept)} recent messages"}

    # -- mode and kill --------------------------------------------------------------
    def set_mode(self, handle: AgentHandle, mode: str) -> None:
        if mode not in MODES:
            raise BadRequest(f"invalid mode {mode!r}: expected one of {', '.join(MODES)}")
        handle.mode = mode
        handle.last_active = utcnow()
        with orm.db_session:
            row = self.store.e.AgentRow.get(id=handle.id)
            row.mode = mode
            row.last_active = handle.last_active

    def kill(self, handle: AgentHandle) -> None:
        """Cancel any run, forget the agent and delete everything it owned."""
        with self._lock:
            handle.killed = True
            handle.state = "Terminated"
            self._agents.pop(handle.id, None)
            if self._by_name.get(handle.name) == handle.id:
                del self._by_name[handle.name]
        self.queues.cancel_queued(handle)
        self.stop(handle)
        with orm.db_session:
            row = self.store.e.AgentRow.get(id=handle.id)
            if row is not None:
                for upload in row.uploads:
                    if upload.path:  # an upload from before schema 2 may still be a file
                        Path(upload.path).unlink(missing_ok=True)
                row.sessions.clear()
                orm.delete(s for s in self.store.e.SessionRow if s.agent.id == handle.id)
                orm.delete(k for k in self.store.e.KvRow if k.agent.id == handle.id)
                orm.delete(u for u in self.store.e.UploadRow if u.agent.id == handle.id)
                row.delete()
        if self.memory is not None:
            self.memory.forget_agent(handle.id)
        log.info("killed agent %s (%s)", handle.name, handle.id)
        if self.audit_hook is not None:
            self.audit_hook("agent.kill", handle.name, {"agent_id": handle.id})

    # -- uploads ----------------------------------------------------------------------
    def save_upload(self, handle: AgentHandle, filename: str, content_type: str, data: bytes) -> dict[str, Any]:
        """Store an uploaded file for later `attachments`."""
        if not data:
            raise BadRequest("uploaded file is empty")
        if len(data) > UPLOAD_LIMIT:
            from agentd.errors import PayloadTooLarge
            raise PayloadTooLarge("file too large (max 10 MB)")
        if not content_type.startswith(UPLOAD_TYPES):
            raise BadRequest(f"unsupported content type {content_type!r}: allowed image/*, text/*, "
                             "audio/*, application/pdf")
        file_id = str(uuid.uuid4())
        safe_name = os.path.basename(filename or "upload")[:200] or "upload"
        # The bytes live in the database: every daemon sharing it can attach the file.
        with orm.db_session:
            self.store.e.UploadRow(id=file_id, agent=handle.id, filename=safe_name,
                                   content_type=content_type, size=len(data), content=data,
                                   created_at=utcnow())
        return {"file_id": file_id, "filename": safe_name, "content_type": content_type, "size": len(data)}

    def _upload(self, handle: AgentHandle, file_id: str) -> dict[str, Any]:
        key = parse_uuid(file_id, "file")
        with orm.db_session:
            row = self.store.e.UploadRow.get(id=key)
            if row is None or row.agent.id != handle.id:
                raise BadRequest(f"unknown attachment file_id {file_id}: upload it to this agent first")
            data = bytes(row.content) if row.content is not None else \
                (Path(row.path).read_bytes() if row.path else b"")
            return {"id": row.id, "filename": row.filename, "content_type": row.content_type,
                    "data": data}

    # -- operations tools use ---------------------------------------------------------
    def ops_for(self, handle: AgentHandle) -> "AgentOpsImpl":
        return AgentOpsImpl(self)


class AgentOpsImpl:
    """What tools may do to other agents and memory, on behalf of one agent."""

    NESTED_LOCK_TIMEOUT = 30.0

    def __init__(self, manager: AgentManager) -> None:
        self.m = manager

    def list_agents(self) -> list[dict[str, Any]]:
        return [{"id": h.id, "name": h.name, "state": h.state, "mode": h.mode,
                 "model": f"{h.provider}/{h.model}", "description": h.manifest.data["description"],
                 "tags": h.manifest.data["tags"]} for h in self.m.handles()]

    def find_agents(self, query: str) -> list[dict[str, Any]]:
        q = query.lower()
        return [a for a in self.list_agents()
                if q in a["name"].lower() or q in a["description"].lower()
                or any(q in t.lower() for t in a["tags"])]

    def send_to_agent(self, caller_id: str, target: str, message: str) -> str:
        handle = self.m.find(target)
        if handle is None:
            raise ToolError(f"no agent with id or name {target!r}")
        if handle.id == caller_id:
            raise ToolError("an agent cannot send a message to itself")
        # Run inline (not on the executor) so nested sends cannot starve the pool.
        try:
            result = self.m.run(handle, message, lock_timeout=self.NESTED_LOCK_TIMEOUT)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return result.response

    def spawn_agent(self, caller_id: str, manifest_toml: str) -> dict[str, Any]:
        try:
            handle = self.m.spawn(manifest_toml)
        except AgentdError as exc:
            raise ToolError(exc.message) from None
        return {"agent_id": handle.id, "name": handle.name}

    def kill_agent(self, caller_id: str, target: str) -> None:
        handle = self.m.find(target)
        if handle is None:
            raise ToolError(f"no agent with id or name {target!r}")
        if handle.id == caller_id:
            raise ToolError("an agent cannot kill itself")
        self.m.kill(handle)

    def kv_get(self, agent_id: str, key: str) -> tuple[bool, Any]:
        return self.m.kv.get(agent_id, key)

    def kv_set(self, agent_id: str, key: str, value: Any) -> None:
        self.m.kv.set(agent_id, key, value)

    def memory_service(self) -> Any:
        """Semantic memory and the knowledge graph (agentd.memory.service.MemoryService)."""
        if self.m.memory is None:
            raise ToolError("semantic memory is not available here")
        return self.m.memory
