"""The one way to start an agent run: `Runs.start(RunRequest)`.

Every run -- a native message, SSE, WebSocket, `/v1`, a channel message, a workflow step,
an agent's send to another agent -- is a `RunRequest` handed to `Runs.start`, which
refuses what must be refused before the caller answers anything (the 64 KB message
limit, the agent's token quota, the budget, a full agent queue) and returns a
`RunTicket`. Where the run executes is the request's `on`:

* `WORKER` -- in the agent's queue, run by a worker of the kernel's executor; the caller
  does not block (`ticket.future`): the WebSocket.
* `CALLER` -- on the caller's thread when the agent is idle (no thread hand-off), else
  queued behind its current run; `ticket.result()` runs or waits. Plain messages, `/v1`,
  SSE.
* `INLINE` -- on the caller's thread, waiting at most `wait` seconds for the agent's
  current run instead of queueing: workflow steps and agent-to-agent sends (a nested send
  must never wait in the queue of an agent that waits for it).

A run in another session of the agent (`session_id`: a channel conversation's) is INLINE
too and takes neither the agent's run lock nor its queue: runs of different conversations
overlap, and the channel dispatcher orders each conversation's own.

Whatever the place, one run is `Runs._execute`: its run lock, its run record and lease
(agentd/cluster/run_leases.py), the agent loop with the model call, and the session write.

Beside it: the request and ticket types and the 64 KB check (agentd/agents/run_request.py),
the quota and budget refusals (run_checks.py), and the user turn (user_turn.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from agentd import logs, tracing
from agentd.agents.approvals import ApprovalQueue
from agentd.agents.events import Event, Sink
from agentd.agents.handle import STOPPED_NOTE, AgentHandle, ConversationSession, RunOptions
from agentd.agents.loop import AgentLoop, LoopStopped, RunCancelled, RunResult, RunSpec
from agentd.agents.model_call import ModelCalls
from agentd.agents.ops import AgentOpsImpl
from agentd.agents.registry import AgentRegistry
from agentd.agents.run_checks import RunChecks, recent_tokens
from agentd.agents.run_errors import AgentRunError, run_error
from agentd.agents.run_request import CALLER, INLINE, WORKER, KeyRows, RunRequest, RunTicket, check_message
from agentd.agents.runqueue import QueuedRun, RunQueues
from agentd.agents.session_store import SessionStore
from agentd.agents.tools import ToolContext
from agentd.agents.tools.services import ModelAccess, ToolServices
from agentd.agents.uploads import Uploads
from agentd.agents.user_turn import build_user_message
from agentd.config import Config
from agentd.errors import AgentdError, Conflict, TooManyRequests
from agentd.llm.catalog import Catalog
from agentd.llm.types import ChatResponse, ImagePart, LLMError, Message
from agentd.memory.kv import KvMemory
from agentd.metrics import Metrics
from agentd.skills import prompt_lines
from agentd.store.outage import as_outage, translate

if TYPE_CHECKING:
    from agentd.a2a.client import A2AClient
    from agentd.agents.cooperation import Cooperation
    from agentd.cluster.coordinator import Cluster
    from agentd.key_runs import KeyRuns
    from agentd.skills import Skills
    from agentd.memory.service import MemoryService
    from agentd.store.writer import Tx

log = logging.getLogger("agentd.agents")


class Runs:
    """Starts, queues, runs and stops agent runs (see the module doc)."""

    def __init__(self, config: Config, catalog: Catalog, registry: AgentRegistry, sessions: SessionStore,
                 models: ModelCalls, uploads: Uploads, queues: RunQueues, approvals: ApprovalQueue,
                 kv: KvMemory, memory: MemoryService | None = None, cluster: Cluster | None = None,
                 preflight: Callable[[AgentHandle], None] | None = None,
                 metrics: Metrics | None = None, cooperation: Cooperation | None = None,
                 tool_services: ToolServices | None = None, skills: Skills | None = None,
                 a2a: A2AClient | None = None, cron: Any = None,
                 key_budget: Callable[[str], None] | None = None, key_runs: KeyRuns | None = None) -> None:
        self.config = config
        self.catalog = catalog
        self.registry = registry
        self.sessions = sessions
        self.models = models
        self.uploads = uploads
        self.queues = queues
        self.approvals = approvals
        self.kv = kv
        self.memory = memory
        self.cluster = cluster
        self.metrics = metrics
        # The task board and the event bus (a failed run is an event too).
        self.cooperation = cooperation
        self.tool_services = tool_services
        self.skills = skills  # the installed skills (agentd/skills)
        self.a2a = a2a  # the client of remote A2A agents (agentd/a2a/client.py)
        self.cron = cron  # the cron jobs the schedule tools manage (agentd/schedules/jobs.py)
        # The quota, the budget (Metering.check_budget) and a scoped key's own budget
        # (KeyBudgets.check_budget), asked before every run.
        self.checks = RunChecks(preflight, key_budget, metrics)
        # What a scoped key's run may start from inside: jobs, other agents' runs (agentd/key_runs.py).
        self.key_runs = key_runs

    # -- starting -----------------------------------------------------------------
    def start(self, request: RunRequest) -> RunTicket:
        """Refuse now what must be refused before the caller answers, then take the run's
        place: queued for a worker, held for the caller, or nothing yet (INLINE)."""
        handle = request.handle
        if request.from_client:
            check_message(request.text)
        if request.session_id:
            self.sessions.ensure(handle, request.session_id, request.label)
        self.checks.precheck(handle, request.key_id)
        if request.session_id and request.on == WORKER:
            # Another session runs beside the agent's queue; the caller still does not block.
            return RunTicket(self, request, future=self.queues.executor.submit(self._execute, request, False))
        if request.session_id or request.on == INLINE:
            return RunTicket(self, request)
        job = QueuedRun(lambda _handle: self._execute(request), request.cancel)
        try:
            if request.on == CALLER:
                return RunTicket(self, request, claimed=self.queues.claim(handle, job))
            return RunTicket(self, request, future=self.queues.submit(handle, job))
        except TooManyRequests:
            self.checks.refused("queue_full", handle)
            raise

    def _model_access(self, handle: AgentHandle) -> ModelAccess:
        info = self.catalog.get_model(handle.model)
        provider = self.catalog.get_provider(handle.provider)
        return ModelAccess(handle.provider, handle.model, info.supports_vision if info is not None else None,
                           provider.endpoints if provider is not None else (),
                           call=lambda request, cancel: self.models.llm_call(handle)(request, None, cancel),
                           endpoint=lambda: self.models.endpoint(handle.provider, handle.api_key_env,
                                                                 handle.base_url))

    def ops_for(self, handle: AgentHandle, origin: str = "", key_id: str = "") -> AgentOpsImpl:
        """What the agent's tools may do to other agents and memory, in a run from `origin`
        paid by `key_id` (a scoped API key; "": the admin's)."""
        return AgentOpsImpl(self.registry, self, self.kv, self.memory, self.cooperation, origin, key_id)

    # -- running ------------------------------------------------------------------
    def build_user_message(self, handle: AgentHandle, text: str, attachments: list[dict[str, Any]],
                           images: list[ImagePart] | None = None) -> tuple[Message, list[dict[str, Any]]]:
        """The user turn (agentd/agents/user_turn.py): 400 for a bad attachment before a run starts."""
        with as_outage():  # attachments are read from the database, maybe on a queued run's worker
            return build_user_message(self.uploads, self.catalog, handle, text, attachments, images)

    def _execute(self, request: RunRequest, recheck: bool = True) -> RunResult:
        if not tracing.enabled():
            return self._execute_untraced(request, recheck)
        with tracing.span("agent.run", {"agentd.agent": request.handle.name, "agentd.run.origin": request.origin},
                          request.trace) as current:
            result = self._execute_untraced(request, recheck)
            current.set_attributes({"gen_ai.usage.input_tokens": result.usage.input_tokens,
                                    "gen_ai.usage.output_tokens": result.usage.output_tokens,
                                    "agentd.run.finish_reason": result.finish_reason})
            return result

    def _execute_untraced(self, request: RunRequest, recheck: bool) -> RunResult:
        """Run one request to completion in the calling thread (`recheck`: the quota and
        budget again, for a run that waited in its agent's queue). `request.cancel` stops
        the run; stop() sets it too, kill() except for a run in another session."""
        # Whichever thread runs it, the run's log lines name its request and agent.
        token = logs.bind(request_id=request.request_id, agent=request.handle.name)
        try:
            return self._execute_bound(request, recheck)
        finally:
            logs.unbind(token)

    def _execute_bound(self, request: RunRequest, recheck: bool) -> RunResult:
        handle = request.handle
        options = request.options or RunOptions()
        if recheck:
            self.checks.precheck(handle, request.key_id)
        user, image_refs = self.build_user_message(handle, request.text, request.attachments, options.images)
        session = ConversationSession(request.session_id) if request.session_id else handle
        lock = None if request.session_id else handle.run_lock
        lock_timeout = request.wait
        if lock is not None and not lock.acquire(timeout=-1 if lock_timeout is None else lock_timeout):
            raise Conflict(f"agent {handle.name} is busy with another run")
        cancel = request.cancel
        emit = request.emit
        started = time.monotonic()
        outcome = "failed"
        try:
            if lock is not None:
                handle.cancel = cancel
            else:
                with handle.queue_lock:
                    handle.session_runs.setdefault(session.session_id, set()).add(cancel)
            if handle.killed or cancel.is_set():
                raise RunCancelled("run cancelled")
            if self.cluster is not None:
                result = self.cluster.run(handle, cancel, lock_timeout,
                                          lambda complete: self._run_locked(handle, session, user, image_refs,
                                                                            emit, options, cancel, complete,
                                                                            request),
                                          completes=True, session_id=session.session_id, key_id=request.key_id)
            else:
                result = self._run_locked(handle, session, user, image_refs, emit, options, cancel, None, request)
            outcome = "completed"
            return result
        except RunCancelled:
            outcome = "cancelled"
            log.info("run stopped: agent=%s provider=%s model=%s duration=%.2fs", handle.name,
                     handle.provider, handle.model, time.monotonic() - started)
            raise
        except Exception as exc:
            unavailable = translate(exc)
            if unavailable is not None:
                # The outage is logged once, not per run; streams end with a 503 error event.
                raise unavailable from None
            # One line per failed run, streamed or not, whatever failed.
            cause = exc.message if isinstance(exc, AgentdError) else f"{type(exc).__name__}: {exc}"
            log.warning("run failed: agent=%s provider=%s model=%s status=%s cause=%s duration=%.2fs",
                        handle.name, getattr(exc, "provider", "") or handle.provider,
                        getattr(exc, "model", "") or handle.model, getattr(exc, "status", 500), cause,
                        time.monotonic() - started)
            self._publish_failure(handle, request, cause)
            raise
        finally:
            if lock is not None:
                handle.cancel = None
                lock.release()
            else:
                with handle.queue_lock:
                    running = handle.session_runs.get(session.session_id)
                    if running is not None:
                        running.discard(cancel)
                        if not running:
                            del handle.session_runs[session.session_id]
            if self.metrics is not None:
                self.metrics.run_finished(request.origin, outcome, time.monotonic() - started, handle.name)

    def _run_locked(self, handle: AgentHandle, session: AgentHandle | ConversationSession, user: Message,
                    image_refs: list[dict[str, Any]], emit: Sink | None, options: RunOptions,
                    cancel: threading.Event, complete: Callable[[Any, float | None], None] | None,
                    request: RunRequest) -> RunResult:
        """One run to completion in `session` (the agent's own: the handle); `complete(tx, cost)`
        closes its run record in the transaction that saves the session (see Cluster.run)."""
        sessions = self.sessions
        window = sessions.window(handle, session)
        tools, caps = self.registry.effective_tools(handle)
        model_cfg = handle.manifest.model
        system = model_cfg["system_prompt"]
        if options.extra_system:
            system = f"{system}\n\n{options.extra_system}"
        skills = self.skills.permitted(handle.manifest.data.get("skills")) if self.skills is not None else []
        if skills and any(t.name == "skill_describe" for t in tools):
            system = f"{system}\n\n{prompt_lines(skills)}"
        recall = None
        owner = None
        if self.memory is not None:
            owner = self._memory_owner(handle, request)
            # Recalled before every model call of the run (unchanged memory is not searched again).
            recall = self.memory.context_for_run(handle.id, user.content or "", window, system, owner=owner)
            system = recall()

        def tool_ctx() -> ToolContext:
            # Made by the run's first tool call: most runs make none.
            workspace = handle.workspace
            if workspace is None:
                workspace = handle.workspace = self.config.workspaces_dir / handle.name
            return ToolContext(agent_id=handle.id, workspace=workspace, capabilities=caps,
                               tools_config=self.config.tools,
                               ops=self.ops_for(handle, request.origin, request.key_id), cancel=cancel,
                               services=self.tool_services, agent_name=handle.name,
                               model=self._model_access(handle), skills=skills, a2a=self.a2a, cron=self.cron,
                               key_id=request.key_id, key_runs=self.key_runs)

        approver = None
        if handle.mode == "Manual":
            def approver(tool: str, args: dict[str, Any]) -> str:
                approval = self.approvals.request(handle.id, handle.name, tool, args)
                if emit is not None:
                    emit(Event("phase", {"phase": "awaiting_approval", "approval_id": approval.id,
                                         "detail": f"{tool} (approval {approval.id})"}))
                return self.approvals.wait(approval, self.config.tools.approval_timeout_secs, cancel)
        costs: list[float | None] = []
        # This run's usage rows, written with its session, each naming the key that pays.
        usage: list[dict[str, Any]] = KeyRows(request.key_id)

        quota = handle.manifest.tokens_per_hour  # (the log is read only against a quota)

        def on_usage(response: ChatResponse) -> None:
            costs.append(getattr(response, "cost_usd", None))
            if quota:
                now = time.monotonic()
                recent_tokens(handle, now).append(
                    (now, response.usage.input_tokens + response.usage.output_tokens))

        spec = RunSpec(model=self.models.catalog.resolve(options.model) if options.model else handle.model,
                       system=system, history=sessions.history(session, window), user=user,
                       tools=tools, tool_ctx=tool_ctx,
                       llm=self.models.llm_call(handle, usage if sessions.write_usage is not None else None,
                                                model=options.model),
                       max_iterations=handle.manifest.max_iterations,
                       tool_timeout=handle.manifest.tool_timeout,
                       max_tokens=options.max_tokens or model_cfg["max_tokens"],
                       temperature=options.temperature if options.temperature is not None
                       else model_cfg["temperature"],
                       emit=emit, approver=approver, on_usage=on_usage,
                       mode_note="Observe mode: read-only tools" if handle.mode == "Observe" else "",
                       params=options.params, refresh_system=recall)
        loop = AgentLoop(spec, cancel)

        def close_turn(tx: Tx, cost: float | None = None, answered: bool = False) -> None:
            # In the transaction that saves the session: what memory recalled for the run is
            # counted as accessed, an answered run's record closed.
            if recall is not None:
                recall.count_accesses(tx)
            if answered and complete is not None:
                complete(tx, cost)

        def save_unanswered(note: str) -> None:
            # A run that ends without an answer still closes its turn, so the history the
            # model sees next time never holds a user message nobody answered.
            sessions.save(handle, loop.new_messages + [Message(role="assistant", content=note)],
                          image_refs, usage, also=close_turn, session=session, source=options.source)

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
        except BaseException:
            sessions.flush_usage(usage)  # whatever failed, the calls made were paid for
            raise
        result.cost_usd = None if not costs or any(c is None for c in costs) else round(sum(costs), 10)
        sessions.save(handle, result.new_messages, image_refs, usage,
                      also=lambda tx: close_turn(tx, result.cost_usd, answered=True), session=session,
                      source=options.source)
        if self.memory is not None:
            self.memory.after_exchange(handle.id, session.session_id, user.content or "", result.response,
                                       owner=owner)
        return result

    def _publish_failure(self, handle: AgentHandle, request: RunRequest, cause: str) -> None:
        if self.cooperation is None:
            return
        from agentd.triggers.bus import AGENT, Event

        self.cooperation.events.publish(Event(AGENT, "agent_failed", {
            "agent_id": handle.id, "agent_name": handle.name, "error": cause[:1000], "run_origin": request.origin,
        }, agent_id=handle.id, origin=request.origin))

    def stop_all(self) -> None:
        """Shutdown: cancel every queued and running run of this daemon (their provider calls
        close at once; an approval a run waits on ends with it). Only this daemon's runs, and
        nothing that needs the database: a stop does not wait on it, nor on its outage."""
        for handle in self.registry.loaded():
            self.queues.cancel_queued(handle)
            for event in (handle.cancel, handle.starting):
                if event is not None:
                    event.set()

    def _memory_owner(self, handle: AgentHandle, request: RunRequest) -> str | None:
        """The person whose episodic memory a run sees and adds to; None: the agent shares
        its episodic memory across sessions (`[memory] share_episodic`, or the manifest's)."""
        shared = handle.manifest.data.get("memory", {}).get("share_episodic")
        if shared is None:
            shared = self.config.memory.share_episodic
        if shared:
            return None
        return request.owner

    def stop(self, handle: AgentHandle, session_id: str | None = None) -> bool:
        """Cancel the agent's current run in its own session, or with `session_id` the runs
        going on in that session of it; True when one was running."""
        if session_id is None or session_id == handle.session_id:
            return self.queues.stop(handle)
        with handle.queue_lock:
            running = [cancel for cancel in handle.session_runs.get(session_id, ()) if not cancel.is_set()]
        for cancel in running:
            cancel.set()
        return bool(running)
