"""Run execution and queueing: quotas, the user turn, one run to completion, submit/wait/stop."""

from __future__ import annotations

import base64
import collections
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, Callable

from pony import orm

from agentd.agents.events import Event, Sink
from agentd.agents.handle import STOPPED_NOTE, AgentHandle, RunOptions
from agentd.agents.loop import AgentLoop, LoopStopped, RunCancelled, RunResult, RunSpec
from agentd.agents.run_errors import AgentRunError, run_error
from agentd.agents.runqueue import ClaimedRun, QueuedRun
from agentd.agents.tools import ToolContext
from agentd.errors import AgentdError, BadRequest, Conflict, NotFound, TooManyRequests
from agentd.kernel_time import utcnow
from agentd.llm.types import ChatResponse, ImagePart, LLMError, Message

log = logging.getLogger("agentd.agents")



class RunExecution:
    """Part of AgentManager: runs messages (inline or through the per-agent run queues)."""

    # -- quotas -----------------------------------------------------------------
    @staticmethod
    def _recent_tokens(handle: AgentHandle, now: float) -> collections.deque:
        """The agent's token log with entries older than an hour dropped (so it stays bounded)."""
        log_ = handle.token_log
        while log_ and log_[0][0] <= now - 3600:
            log_.popleft()
        return log_

    def _check_quota(self, handle: AgentHandle) -> None:
        limit = handle.manifest.tokens_per_hour
        if not limit:
            return
        now = time.time()
        log_ = self._recent_tokens(handle, now)
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
                                        lambda complete: self._run_locked(handle, user, image_refs, emit,
                                                                          options, cancel, complete),
                                        completes=True)
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
                    emit: Sink | None, options: RunOptions, cancel: threading.Event,
                    complete: Callable[[float | None], None] | None = None) -> RunResult:
        """One run to completion; `complete(cost)` closes its run record in the transaction
        that saves the session (see Cluster.run)."""
        window = self._window(handle)
        tools, caps = self.effective_tools(handle)
        model_cfg = handle.manifest.model
        system = model_cfg["system_prompt"]
        if options.extra_system:
            system = f"{system}\n\n{options.extra_system}"
        refresh_system = None
        if self.memory is not None:
            # Recalled before every model call of the run (unchanged memory is not searched again).
            refresh_system = self.memory.context_for_run(handle.id, user.content or "", window, system)
            system = refresh_system()
        workspace = handle.workspace
        if workspace is None:
            workspace = handle.workspace = self.config.workspaces_dir / handle.name
        ctx = ToolContext(agent_id=handle.id, workspace=workspace,
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
        usage: list[dict[str, Any]] = []  # this run's usage rows, written with its session

        quota = handle.manifest.tokens_per_hour  # (the log is read only against a quota)

        def on_usage(response: ChatResponse) -> None:
            costs.append(getattr(response, "cost_usd", None))
            if quota:
                now = time.time()
                self._recent_tokens(handle, now).append(
                    (now, response.usage.input_tokens + response.usage.output_tokens))

        spec = RunSpec(model=handle.model, system=system, history=self._history(handle, window), user=user,
                       tools=tools, tool_ctx=ctx, llm=self._llm_call(handle, usage),
                       max_iterations=handle.manifest.max_iterations,
                       tool_timeout=handle.manifest.tool_timeout,
                       max_tokens=options.max_tokens or model_cfg["max_tokens"],
                       temperature=options.temperature if options.temperature is not None
                       else model_cfg["temperature"],
                       emit=emit, approver=approver, on_usage=on_usage,
                       mode_note="Observe mode: read-only tools" if handle.mode == "Observe" else "",
                       params=options.params, refresh_system=refresh_system)
        loop = AgentLoop(spec, cancel)

        def save_unanswered(note: str) -> None:
            # A run that ends without an answer still closes its turn, so the history the
            # model sees next time never holds a user message nobody answered.
            self._save_session(handle, loop.new_messages + [Message(role="assistant", content=note)],
                               image_refs, usage)

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
            self._flush_usage(usage)  # whatever failed, the calls made were paid for
            raise
        result.cost_usd = None if not costs or any(c is None for c in costs) else round(sum(costs), 10)
        self._save_session(handle, result.new_messages, image_refs, usage,
                           also=None if complete is None else lambda tx: complete(tx, result.cost_usd))
        if self.memory is not None:
            self.memory.after_exchange(handle.id, handle.session_id, user.content or "", result.response)
        return result

    def submit(self, handle: AgentHandle, text: str, attachments: list[dict[str, Any]] | None = None,
               emit: Sink | None = None, options: RunOptions | None = None,
               cancel: threading.Event | None = None) -> Future:
        """Queue a run for `handle`; different agents run in parallel on the kernel's executor,
        and a request waiting for a busy agent holds no worker (see runqueue.py)."""
        return self.queues.submit(handle, QueuedRun(text, attachments, emit, options,
                                                    cancel or threading.Event(), Future()))

    def run_now(self, handle: AgentHandle, text: str, attachments: list[dict[str, Any]] | None = None,
                options: RunOptions | None = None, cancel: threading.Event | None = None,
                disconnected: Callable[[], bool] | None = None) -> RunResult:
        """submit() + wait() for a caller that blocks anyway: an idle agent's run uses the
        calling thread (see RunQueues.run_here); a busy agent's is queued as submit() does."""
        return self.queues.run_here(handle, QueuedRun(text, attachments, None, options,
                                                      cancel or threading.Event(), Future()), disconnected)

    def claim(self, handle: AgentHandle, text: str, attachments: list[dict[str, Any]] | None = None,
              emit: Sink | None = None, options: RunOptions | None = None,
              cancel: threading.Event | None = None) -> ClaimedRun:
        """run_now() in two steps, for a caller that answers between them: refusals (a full
        queue) come now, the run with `ClaimedRun.result` (see RunQueues.claim)."""
        return self.queues.claim(handle, QueuedRun(text, attachments, emit, options,
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
        cancel = handle.cancel or handle.starting
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
                self.store.e.SessionRow(id=session_id, agent=agent_row, label=label or None, created_at=utcnow())
        # Its own session and run lock; no cached window (read from the conversation's row on
        # first use). The queue fields are never used: a conversation's run is not queued.
        view = replace(handle, session_id=session_id, run_lock=threading.Lock(), session_tail=None)
        return self.run(view, text)
