"""The A2A JSON-RPC methods, mapped onto agent runs.

`message/send` runs the message and answers a completed (or failed) Task whose artifact is
the agent's answer; `message/stream` answers the same as a stream of JSON-RPC responses
(the Task, status updates, the answer's text as artifact chunks, a final status);
`tasks/get` and `tasks/cancel` look a task up. The A2A 1.0 method names (`SendMessage`,
`SendStreamingMessage`, `GetTask`, `CancelTask`) are the same methods.

A message's `contextId` is a conversation: each (agent, context) pair has its own session of
the agent, so several A2A conversations with one agent never share history. Every run is a
`RunRequest` with origin `a2a` through `Runs.start`.

Tasks are kept in memory (the newest MAX_TASKS) for `tasks/get`; the conversation itself is
in the agent's session in the database.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import uuid
from typing import Any, Callable, Iterator

from agentd.a2a.wire import (INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND,
                              PUSH_NOT_SUPPORTED, TASK_NOT_CANCELABLE, TASK_NOT_FOUND,
                              UNSUPPORTED_OPERATION, VERSION_NOT_SUPPORTED, RpcError, agent_message,
                              message_text, result_response, text_part, to_v1)
from agentd.agents.events import Event
from agentd.agents.loop import RunCancelled
from agentd.agents.run_request import RunRequest
from agentd.principals import ADMIN, Principal
from agentd.errors import AgentdError
from agentd.timestamps import iso, utcnow

log = logging.getLogger("agentd.a2a")

MAX_TASKS = 1000
KEEPALIVE_SECS = 15.0
TERMINAL = {"completed", "failed", "canceled", "rejected"}
_CONTEXTS = uuid.UUID("6f1c6d52-4b53-4c53-9a1e-2b0a2a000001")  # namespace of context -> session ids

# Where a message to the daemon's endpoint may name its agent (params.metadata or message.metadata).
AGENT_KEYS = ("agent", "agent_name", "agentName", "agent_id", "agentId")
SEND = {"message/send", "SendMessage"}
STREAM = {"message/stream", "SendStreamingMessage"}
GET = {"tasks/get", "GetTask"}
CANCEL = {"tasks/cancel", "CancelTask"}
# The A2A versions served (Major.Minor; A2A reads a request without `A2A-Version` as 0.3).
VERSIONS = ("0.3", "1.0")
# A2A methods this server knows but does not offer (the card says so too).
UNSUPPORTED = {"tasks/resubscribe", "SubscribeToTask", "tasks/list", "ListTasks",
               "agent/getAuthenticatedExtendedCard", "GetExtendedAgentCard"}


class A2AService:
    """The JSON-RPC methods over the kernel's agents and runs."""

    def __init__(self, agents: Any, runs: Any) -> None:
        self.agents = agents
        self.runs = runs
        self._tasks: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._cancels: dict[str, threading.Event] = {}
        self._task_keys: dict[str, str] = {}  # the scoped key that started each task ("": admin)
        self._lock = threading.Lock()

    # -- requests -----------------------------------------------------------------
    @staticmethod
    def check_request(payload: Any) -> tuple[Any, str, dict[str, Any]]:
        """(id, method, params) of a JSON-RPC 2.0 request, or RpcError (-32600 / -32602)."""
        if not isinstance(payload, dict):
            raise RpcError(INVALID_REQUEST, "the request must be one JSON-RPC 2.0 object")
        rpc_id = payload.get("id")
        if payload.get("jsonrpc") != "2.0" or not isinstance(payload.get("method"), str) \
                or not isinstance(rpc_id, (str, int)) or isinstance(rpc_id, bool):
            raise RpcError(INVALID_REQUEST, "invalid JSON-RPC 2.0 request: it needs jsonrpc \"2.0\", "
                                            "a string method and a string or integer id")
        params = payload.get("params", {})
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        return rpc_id, payload["method"], params

    @staticmethod
    def check_version(header: str | None) -> None:
        """RpcError -32009 for an `A2A-Version` this server does not speak (its patch part aside)."""
        version = (header or "").strip()
        if version and ".".join(version.split(".")[:2]) not in VERSIONS:
            raise RpcError(VERSION_NOT_SUPPORTED, f"A2A version {version[:20]} is not supported "
                                                  f"(supported: {', '.join(VERSIONS)})", {"supported": list(VERSIONS)})

    def is_stream(self, method: str) -> bool:
        return method in STREAM

    def runs_a_message(self, method: str) -> bool:
        return method in SEND

    def call(self, method: str, params: dict[str, Any], agent_name: str | None,
             wait: Callable[[Any], Any] | None = None, caller: Principal = ADMIN,
             submit: Callable[[Callable[[], Any]], Any] | None = None) -> Any:
        """The result of a non-streaming method (`wait(ticket)` waits for a run's result;
        `submit(fn)` runs a run elsewhere when the client asks not to wait), as `caller` (the
        request's API key) may see and do it."""
        v1 = method[:1].isupper()
        if method in SEND:
            result = self._send(params, agent_name, wait, caller, submit)
            return {"task": to_v1(result)} if v1 else result
        if method in GET:
            task = self._task(params, agent_name, caller)
            return to_v1(task) if v1 else task
        if method in CANCEL:
            task = self._cancel(params, agent_name, caller)
            return to_v1(task) if v1 else task
        if method in STREAM:
            raise RpcError(INVALID_REQUEST, f"{method} answers a stream; it cannot be sent here")
        if "pushnotification" in method.lower():
            raise RpcError(PUSH_NOT_SUPPORTED, "Push Notification is not supported")
        if method in UNSUPPORTED:
            raise RpcError(UNSUPPORTED_OPERATION, f"{method} is not supported by this agent")
        raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")

    # -- message/send -------------------------------------------------------------
    def _prepare(self, params: dict[str, Any], agent_name: str | None,
                 caller: Principal) -> tuple[Any, str, dict[str, Any], str]:
        message = params.get("message")
        text = message_text(message)
        meta = params.get("metadata") if isinstance(params.get("metadata"), dict) else {}
        msg_meta = message.get("metadata") if isinstance(message.get("metadata"), dict) else {}
        named = [m.get(k) for m in (meta, msg_meta) for k in AGENT_KEYS if m.get(k)]
        handle = self._agent(agent_name, named[0] if named else None, caller)
        context_id = message.get("contextId")
        if context_id is not None and (not isinstance(context_id, str) or not context_id or len(context_id) > 200):
            raise RpcError(INVALID_PARAMS, "message.contextId must be a non-empty string of at most 200 characters")
        task_ref = message.get("taskId")
        if task_ref is not None:
            # A task a message names must be one of the caller's for this agent (A2A: a
            # client's taskId references an existing task); one still running continues its context.
            with self._lock:
                earlier = self._tasks.get(task_ref) if isinstance(task_ref, str) else None
                same_key = self._task_keys.get(task_ref, "") == caller.key_id if earlier is not None else False
            if earlier is None or earlier["metadata"]["agent"] != handle.name or not same_key:
                raise RpcError(TASK_NOT_FOUND, "Task not found", {"id": task_ref})
            if context_id and context_id != earlier["contextId"]:
                raise RpcError(INVALID_PARAMS, f"message.contextId is not the context of task {task_ref}")
            state = earlier["status"]["state"]
            if state in TERMINAL:
                # A2A: a task that ended takes no more messages; its context does.
                raise RpcError(UNSUPPORTED_OPERATION, f"task {task_ref} is {state}: it takes no more messages; "
                                                      "send to its contextId instead", {"id": task_ref})
            context_id = earlier["contextId"]
        context_id = context_id or str(uuid.uuid4())
        task_id = str(uuid.uuid4())
        user = {"kind": "message", "messageId": str(message.get("messageId") or uuid.uuid4()), "role": "user",
                "parts": [text_part(text)], "contextId": context_id, "taskId": task_id}
        task = {"kind": "task", "id": task_id, "contextId": context_id,
                "status": {"state": "submitted", "timestamp": iso(utcnow())},
                "artifacts": [], "history": [user], "metadata": {"agent": handle.name}}
        with self._lock:
            self._task_keys[task_id] = caller.key_id
        return handle, text, task, context_id

    def _agent(self, path_name: str | None, ref: Any, caller: Principal = ADMIN) -> Any:
        """The agent of the endpoint's path, else the one the metadata names (name or id), else
        the only agent there is; an agent outside the caller's key is as absent."""
        if path_name is not None:
            handle = self.agents.by_name(path_name)
        elif ref is not None:
            handle = self.agents.find(ref) if isinstance(ref, str) else None
        else:
            handles = caller.visible(self.agents.handles())
            if len(handles) == 1:
                return handles[0]
            raise RpcError(INVALID_PARAMS, "name the agent: params.metadata.agent, or send to the agent's own "
                                           "endpoint /a2a/agents/<name>")
        if handle is None or not caller.sees(handle):
            raise RpcError(INVALID_PARAMS, f"no agent named {path_name or ref!r}")
        return handle

    def _request(self, handle: Any, text: str, context_id: str, emit: Any = None,
                 cancel: threading.Event | None = None, caller: Principal = ADMIN) -> RunRequest:
        # A context is a conversation of its own; a scoped key's contexts are its own too.
        session = str(uuid.uuid5(_CONTEXTS, f"{handle.id}:{caller.key_id}:{context_id}" if caller.key_id
                                 else f"{handle.id}:{context_id}"))
        return RunRequest(handle, text, emit=emit, cancel=cancel or threading.Event(), session_id=session,
                          label=f"a2a:{context_id}"[:200], origin="a2a", key_id=caller.key_id,
                          owner=f"key:{caller.key_id}" if caller.key_id else "")

    def _start(self, handle: Any, text: str, context_id: str, task: dict[str, Any], emit: Any = None,
               caller: Principal = ADMIN) -> Any:
        cancel = threading.Event()
        try:
            ticket = self.runs.start(self._request(handle, text, context_id, emit, cancel, caller))
        except AgentdError as exc:
            code = INVALID_PARAMS if exc.status in (400, 404, 413) else INTERNAL_ERROR
            raise RpcError(code, exc.message, {"status": exc.status}) from None
        task["status"] = {"state": "working", "timestamp": iso(utcnow())}
        self._remember(task, cancel)
        return ticket

    def _finish(self, task: dict[str, Any], result: Any = None, exc: BaseException | None = None) -> None:
        if exc is None:
            answer = agent_message(result.response, task["contextId"], task["id"])
            task["artifacts"] = [{"artifactId": str(uuid.uuid4()), "name": "response",
                                  "parts": [text_part(result.response)]}]
            task["history"].append(answer)
            task["status"] = {"state": "completed", "message": answer, "timestamp": iso(utcnow())}
        else:
            state = "canceled" if isinstance(exc, RunCancelled) else "failed"
            text = "run stopped" if state == "canceled" else (
                exc.message if isinstance(exc, AgentdError) else f"internal error: {type(exc).__name__}")
            task["status"] = {"state": state, "message": agent_message(text, task["contextId"], task["id"]),
                              "timestamp": iso(utcnow())}
        with self._lock:
            self._cancels.pop(task["id"], None)

    def _send(self, params: dict[str, Any], agent_name: str | None, wait: Callable[[Any], Any] | None,
              caller: Principal, submit: Callable[[Callable[[], Any]], Any] | None = None) -> dict:
        handle, text, task, context_id = self._prepare(params, agent_name, caller)
        ticket = self._start(handle, text, context_id, task, caller=caller)
        config = params.get("configuration") if isinstance(params.get("configuration"), dict) else {}
        # A2A 0.3's `blocking: false`, 1.0's `returnImmediately: true`: answer the working
        # task now; the client follows it with tasks/get.
        if submit is not None and (config.get("blocking") is False or config.get("returnImmediately") is True):
            now = dict(task, history=list(task["history"]))
            submit(lambda: self._settle(task, ticket.result))
            return now
        self._settle(task, lambda: wait(ticket) if wait is not None else ticket.result())
        return task

    def _settle(self, task: dict[str, Any], result: Callable[[], Any]) -> None:
        try:
            value = result()
        except Exception as exc:  # noqa: BLE001 - every failure of the run is the task's state
            self._finish(task, exc=exc)
        else:
            self._finish(task, value)

    # -- message/stream -----------------------------------------------------------
    def stream(self, rpc_id: Any, method: str, params: dict[str, Any], agent_name: str | None,
               submit: Callable[[Callable[[], Any]], Any], alive: Callable[[], bool],
               poll: float = 0.1, caller: Principal = ADMIN) -> Iterator[dict[str, Any]]:
        """The JSON-RPC responses of a streamed message (RpcError before the first one);
        `submit(fn)` runs the run elsewhere; `alive()` False stops it (the client left)."""
        v1 = method[:1].isupper()
        handle, text, task, context_id = self._prepare(params, agent_name, caller)
        events: queue.Queue = queue.Queue()
        ticket = self._start(handle, text, context_id, task, emit=events.put, caller=caller)
        artifact_id = str(uuid.uuid4())

        def run() -> None:
            try:
                events.put(("result", ticket.result()))
            except BaseException as exc:  # noqa: BLE001 - handed to the stream
                events.put(("failure", exc))

        submit(run)
        return self._stream_events(rpc_id, v1, task, ticket, events, artifact_id, alive, poll)

    def _stream_events(self, rpc_id: Any, v1: bool, task: dict[str, Any], ticket: Any, events: queue.Queue,
                       artifact_id: str, alive: Callable[[], bool], poll: float) -> Iterator[dict[str, Any]]:
        def wrap(kind: str, value: dict[str, Any]) -> dict[str, Any]:
            if not v1:
                return result_response(rpc_id, value)
            name = {"task": "task", "status-update": "statusUpdate", "artifact-update": "artifactUpdate"}[kind]
            return result_response(rpc_id, {name: to_v1(value)})

        def status(final: bool) -> dict[str, Any]:
            return wrap("status-update", {"kind": "status-update", "taskId": task["id"],
                                          "contextId": task["contextId"], "status": task["status"],
                                          "final": final})

        def chunk(text: str, append: bool, last: bool) -> dict[str, Any]:
            return wrap("artifact-update", {
                "kind": "artifact-update", "taskId": task["id"], "contextId": task["contextId"],
                "artifact": {"artifactId": artifact_id, "name": "response", "parts": [text_part(text)]},
                "append": append, "lastChunk": last})

        first = dict(task, status={"state": "submitted", "timestamp": task["status"]["timestamp"]})
        yield wrap("task", first)
        yield status(False)
        sent = False
        finished = False
        quiet = 0.0
        try:
            while True:
                try:
                    item = events.get(timeout=poll)
                    quiet = 0.0
                except queue.Empty:
                    if not alive():
                        return
                    quiet += poll
                    if quiet >= KEEPALIVE_SECS:
                        quiet = 0.0
                        yield {}  # a keep-alive comment: proxies keep the stream open
                    continue
                if isinstance(item, Event):
                    if item.type == "text_delta" and item.data.get("content"):
                        yield chunk(item.data["content"], sent, False)
                        sent = True
                    continue
                what, value = item
                if what == "result":
                    self._finish(task, value)
                    if not sent:
                        yield chunk(value.response, False, True)
                    else:
                        yield chunk("", True, True)
                    task["artifacts"] = [{"artifactId": artifact_id, "name": "response",
                                          "parts": [text_part(value.response)]}]
                else:
                    self._finish(task, exc=value)
                finished = True
                yield status(True)
                return
        finally:
            if not finished:
                # The client left: its run is stopped, and the task reads so from now on.
                ticket.stop()
                self._finish(task, exc=RunCancelled("run cancelled"))

    # -- tasks --------------------------------------------------------------------
    def _remember(self, task: dict[str, Any], cancel: threading.Event) -> None:
        with self._lock:
            self._tasks[task["id"]] = task
            self._cancels[task["id"]] = cancel
            while len(self._tasks) > MAX_TASKS:
                old, _ = self._tasks.popitem(last=False)
                self._cancels.pop(old, None)
                self._task_keys.pop(old, None)

    def _lookup(self, params: dict[str, Any], agent_name: str | None, caller: Principal) -> dict[str, Any]:
        task_id = params.get("id")
        if not isinstance(task_id, str) or not task_id:
            raise RpcError(INVALID_PARAMS, "params.id must be the task's id")
        with self._lock:
            task = self._tasks.get(task_id)
        if (task is None or (agent_name and task["metadata"]["agent"] != agent_name)
                or (caller.key_id and self._task_keys.get(task_id) != caller.key_id)):
            raise RpcError(TASK_NOT_FOUND, "Task not found", {"id": task_id})
        return task

    def _task(self, params: dict[str, Any], agent_name: str | None, caller: Principal) -> dict[str, Any]:
        task = self._lookup(params, agent_name, caller)
        length = params.get("historyLength")
        if length is not None:
            if isinstance(length, bool) or not isinstance(length, int) or length < 0:
                raise RpcError(INVALID_PARAMS, "params.historyLength must be a non-negative integer")
            task = dict(task, history=task["history"][-length:] if length else [])
        return task

    def _cancel(self, params: dict[str, Any], agent_name: str | None, caller: Principal) -> dict[str, Any]:
        task = self._lookup(params, agent_name, caller)
        with self._lock:
            cancel = self._cancels.get(task["id"])
        if task["status"]["state"] in TERMINAL or cancel is None:
            raise RpcError(TASK_NOT_CANCELABLE, "Task cannot be canceled", {"id": task["id"]})
        cancel.set()
        task["status"] = {"state": "canceled", "timestamp": iso(utcnow())}
        return task
