"""WebSocket routes (flask-sock): the agent socket and a diagnostic echo.

Agent socket frames (JSON text both ways):
  client: {type: "message", content, attachments?} | {type: "ping"} |
          {type: "command", command: "stop" | "reset" | "compact"}
  server: connected {agent_id}, message {content, source: cron, job_id, job_name} (a cron job's
          run starts; its typing/response frames follow), typing {state: start|tool|stop, tool?}, text_delta {content},
          tool_start {id, tool}, tool_end {id, tool, input}, tool_result {id, tool, result, is_error},
          phase {phase, detail}, response {content, input_tokens, output_tokens, iterations, cost_usd},
          error {content}, pong, command_result {command, message}
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from flask import Blueprint, Flask, Response, current_app, request

from agentd import jsonsafe
from agentd.agents.events import Event
from agentd.agents.loop import RunCancelled
from agentd.agents.manager import AgentHandle
from agentd.agents.run_request import RunRequest, RunTicket, check_message
from agentd.api import body
from agentd.api.apidoc import doc
from agentd.api.principal import principal, rechecker, run_fields
from agentd.api.runs import stream_slots
from agentd.api.schemas import MESSAGE_SCHEMA
from agentd.principals import ADMIN, Principal
from agentd.errors import AgentdError, BadRequest, Unauthorized
from agentd.schema_fields import is_blank
from agentd.store.outage import as_outage

log = logging.getLogger("agentd.ws")

FRAME_LIMIT = 64 * 1024
# A `{type: message}` frame carrying a message of FRAME_LIMIT bytes is longer than that by its
# envelope, and 3 times as long when a client escapes its two-byte characters (`\u00e9`).
JSON_FRAME_LIMIT = 4 * FRAME_LIMIT
WS_DESCRIPTION = (
    "Upgrade with a WebSocket handshake (`Upgrade: websocket`); auth like the API (Bearer header or "
    "`?token=`); an unknown agent is a 404 before the upgrade. Frames are JSON text.\n\n"
    "Client frames: `{type: message, content, attachments?}` runs a message (non-JSON text counts as a "
    "message); `{type: ping}` is answered with `pong`; `{type: command, command: stop|reset|new|compact}`.\n\n"
    "Server frames: `connected {agent_id}`; `message {content, source: cron, job_id, job_name}` when one of "
    "the agent's cron jobs starts a run (its typing, delta and response frames follow); `typing {state: start|tool|stop, tool?}`; `text_delta {content}`; "
    "`tool_start {id, tool}`; `tool_end {id, tool, input}`; `tool_result {id, tool, result, is_error}`; "
    "`phase {phase, detail}`; `response {content, input_tokens, output_tokens, iterations, cost_usd}`; "
    "`error {content}` (a message over 64 KB, counted in its content; other frames over 64 KB; more than 10 "
    "messages a minute; unknown types; failed runs); "
    "`command_result {command, message}`; `pong`.")
MESSAGES_PER_MINUTE = 10


class AgentSocket:
    """One connected client talking to one agent."""

    def __init__(self, ws: Any, kernel: Any, handle: AgentHandle, who: Principal = ADMIN,
                 user: str | None = None, session: str | None = None,
                 recheck: Callable[[], Principal] | None = None) -> None:
        self.ws = ws
        self.kernel = kernel
        self.handle = handle
        # Who connected (the key that pays), and the person (`?user=`/`?session=`, or a
        # frame's `user`/`session`) whose session of the agent a message runs in.
        self.who = who
        self.user = user
        self.session = session
        # A scoped key is resolved again before each frame that acts (agentd/api/principal.py).
        self._recheck = recheck
        # The session this socket talks in (None: the agent's own), for its commands and
        # for the cron runs it is shown.
        self.session_id = run_fields(who, handle, user, session, own_session=True).get("session_id")
        self._send_lock = threading.Lock()
        self._recent: deque[float] = deque()
        self.open = True
        # This socket's runs (queued or running): a client that goes away stops them.
        self._runs: dict[Any, RunTicket] = {}

    def send(self, type_: str, **data: Any) -> None:
        """Send one frame; a client that left is noted, not raised."""
        if not self.open:
            return
        frame = json.dumps({"type": type_, **data}, separators=(",", ":"))
        from simple_websocket import ConnectionClosed  # loaded by the upgrade already

        try:
            with self._send_lock:
                self.ws.send(frame)
        except (ConnectionClosed, OSError):
            self.open = False

    def on_event(self, event: Event) -> None:
        d = event.data
        if event.type == "text_delta":
            self.send("text_delta", content=d["content"])
        elif event.type == "tool_use":
            self.send("typing", state="tool", tool=d["tool"])
            self.send("tool_start", id=d["id"], tool=d["tool"])
        elif event.type == "tool_input":
            self.send("tool_end", id=d["id"], tool=d["tool"], input=d["input"])
        elif event.type == "tool_result":
            self.send("tool_result", id=d["id"], tool=d["tool"], result=d["result"], is_error=d["is_error"])
        elif event.type == "phase":
            self.send("phase", phase=d["phase"], detail=d.get("detail") or "")

    def _rate_ok(self) -> bool:
        now = time.monotonic()
        while self._recent and self._recent[0] <= now - 60:
            self._recent.popleft()
        if len(self._recent) >= MESSAGES_PER_MINUTE:
            return False
        self._recent.append(now)
        return True

    def handle_message(self, frame: dict[str, Any]) -> None:
        content = frame.get("content")
        if not isinstance(content, str) or is_blank(content):
            self.send("error", content="missing or empty 'content' field")
            return
        if not self._allowed("message"):
            return
        try:
            check_message(content)
        except AgentdError as exc:
            self.send("error", content=exc.message)
            return
        attachments = frame.get("attachments") or []
        if attachments:
            # Checked as the HTTP message endpoints check them, with their error texts.
            try:
                attachments = body.validate(MESSAGE_SCHEMA, {"message": content, "attachments": attachments})[
                    "attachments"]
            except AgentdError as exc:
                self.send("error", content=exc.message)
                return
        if not self._rate_ok():
            self.send("error", content=f"rate limit exceeded: at most {MESSAGES_PER_MINUTE} messages a minute")
            return
        # The run's events wait for `typing: start`: a run that starts at once on another
        # thread must not get its first frames out before it.
        started = threading.Event()

        def emit(event: Event) -> None:
            started.wait()
            self.on_event(event)

        try:
            user, session = frame.get("user") or self.user, frame.get("session") or self.session
            if not isinstance(user, (str, type(None))) or not isinstance(session, (str, type(None))):
                raise BadRequest("'user' and 'session' must be strings")
            with as_outage():
                ticket = self.kernel.runs.start(RunRequest(self.handle, content, attachments, emit=emit, origin="ws",
                                                           **run_fields(self.who, self.handle, user, session,
                                                                        own_session=True)))
        except AgentdError as exc:  # quota, budget, the agent's queue is full, the database is down
            self.send("error", content=exc.message)
            return
        future = ticket.future
        self.send("typing", state="start")
        started.set()
        self._runs[future] = ticket

        def finished(f: Any) -> None:
            # `typing: stop` goes first: the final frame must be the last one a client sees.
            self.send("typing", state="stop")
            exc = f.exception()
            if exc is None:
                r = f.result()
                self.send("response", content=r.response, input_tokens=r.usage.input_tokens,
                          output_tokens=r.usage.output_tokens, iterations=r.iterations, cost_usd=r.cost_usd)
            elif isinstance(exc, RunCancelled):
                self.send("error", content="run cancelled")
            else:
                self.send("error", content=exc.message if isinstance(exc, AgentdError) else "internal error")
            self._runs.pop(f, None)

        future.add_done_callback(finished)

    def handle_command(self, frame: dict[str, Any]) -> None:
        command = frame.get("command")
        agents = self.kernel.agents
        if command not in ("stop", "reset", "new", "compact"):
            self.send("error", content=f"unknown command {command!r}: use stop, reset or compact")
        elif not self._allowed("message" if command == "stop" else "manage"):
            return
        elif command == "stop":
            self._answer(command, lambda: "run cancelled" if agents.stop(self.handle, self.session_id)
                         else "no run in progress")
        elif command in ("reset", "new"):
            def reset() -> str:
                agents.reset_session(self.handle, self.session_id)
                return "session reset; history cleared"
            self._answer(command, reset)
        else:
            self.kernel.executor.submit(self._answer, "compact", lambda: agents.compact(self.handle, self.session_id)["message"])

    def _allowed(self, scope: str) -> bool:
        """Whether the key may still act with `scope` on this agent, checked as a request's
        would be: a key deleted, disabled, expired or rotated since the handshake ends the
        socket; a scope or an agent taken from it refuses the frame."""
        if self._recheck is None:
            return True
        try:
            with as_outage():
                who = self._recheck()
            who.require(scope)
            who.reach(self.handle)
        except Unauthorized as exc:
            self.send("error", content=exc.message)
            self.open = False
            return False
        except AgentdError as exc:
            self.send("error", content=exc.message)
            return False
        self.who = who
        return True

    def _answer(self, command: str, work: Callable[[], str]) -> None:
        """Run a command's `work` and send its result, or the `error` frame it failed with
        (a database outage included: the socket stays open)."""
        try:
            with as_outage():
                message = work()
        except AgentdError as exc:
            self.send("error", content=exc.message)
            return
        self.send("command_result", command=command, message=message)

    def serve(self) -> None:
        self.send("connected", agent_id=self.handle.id)
        # Runs of the agent's cron jobs are shown here too (agentd/schedules/scheduler.py).
        self.kernel.listeners.add(self.handle.id, self)
        try:
            self._receive()
        finally:
            self.kernel.listeners.remove(self.handle.id, self)
        if self.kernel.stopping.is_set():
            self._see_runs_end()
        self.open = False
        self.stop_runs()

    def _see_runs_end(self) -> None:
        """The daemon is stopping and has stopped this socket's runs: each sends its end as
        a stop command's does (`typing: stop`, `error: run cancelled`), as SSE and `/v1`
        clients get theirs, within the grace period; then the socket goes away."""
        deadline = time.monotonic() + self.kernel.config.api.shutdown_grace_secs
        while self._runs and self.open and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._send_lock:
            going_away(self.ws)

    def _receive(self) -> None:
        from simple_websocket import ConnectionClosed  # loaded by the upgrade already

        while self.open and not self.kernel.stopping.is_set():
            try:
                # A short wait: a client that left is noticed (and its run stopped) promptly.
                raw = self.ws.receive(timeout=0.25)
            except ConnectionClosed:
                break
            if raw is None:
                continue
            if isinstance(raw, bytes):
                raw = raw.decode("utf-8", "replace")
            size = len(raw.encode("utf-8"))
            if size > JSON_FRAME_LIMIT:
                self.send("error", content=f"frame too large (max {FRAME_LIMIT // 1024} KB)")
                continue
            try:
                frame = jsonsafe.loads(raw)
            except (jsonsafe.JsonTooDeep, jsonsafe.JsonNotPortable) as exc:
                self.send("error", content=str(exc))
                continue
            except ValueError:
                frame = {"type": "message", "content": raw}
            if not isinstance(frame, dict):
                frame = {"type": "message", "content": raw}
            kind = frame.get("type")
            # A message frame's own limit is its content's (check_message: 64 KB, like the
            # HTTP message endpoints); its JSON envelope and escapes come on top.
            if size > FRAME_LIMIT and (kind != "message" or frame.get("content") is raw):
                self.send("error", content=f"frame too large (max {FRAME_LIMIT // 1024} KB)")
                continue
            if kind == "ping":
                self.send("pong")
            elif kind == "message":
                self.handle_message(frame)
            elif kind == "command":
                self.handle_command(frame)
            else:
                self.send("error", content=f"unknown frame type {kind!r}")

    def stop_runs(self) -> None:
        """The client is gone: withdraw this socket's queued runs and cancel its running one."""
        for ticket in list(self._runs.values()):
            ticket.stop()


def going_away(ws: Any) -> None:
    """Close with 1001 "going away": the daemon is stopping (a client that left already is fine)."""
    from simple_websocket import ConnectionClosed  # loaded by the upgrade already

    try:
        ws.close(1001)
    except (ConnectionClosed, OSError):
        pass


class _LazySock:
    """`flask_sock.Sock.route` with flask-sock imported on the first WebSocket request.

    flask-sock pulls in simple-websocket, wsproto and asyncio (about 2.5 MB); a daemon
    nobody opens a socket to never loads them. The view flask-sock builds is the one that
    runs: its decorator is applied, on first use, with a stand-in for the blueprint that
    keeps the view instead of registering it (flask-sock calls `bp.route(path, **kw)(view)`)."""

    def route(self, path: str, bp: Blueprint) -> Callable[[Callable[..., None]], None]:
        def decorator(handler: Callable[..., None]) -> None:
            built: list[Callable[..., Any]] = []

            @functools.wraps(handler)
            def view(*args: Any, **kwargs: Any) -> Any:
                # The two headers routing does not look at; without them the handshake would fail
                # after its 101 was counted.
                if request.headers.get("Sec-WebSocket-Version") != "13" or not request.headers.get(
                        "Sec-WebSocket-Key"):
                    raise BadRequest("not a WebSocket handshake: send Sec-WebSocket-Key and "
                                     "Sec-WebSocket-Version: 13")
                if not built:
                    from flask_sock import Sock

                    Sock().route(path, bp=_Keep(built))(handler)
                return _Opening(functools.partial(built[0], *args, **kwargs))

            bp.route(path, websocket=True)(view)

        return decorator


class _Opening(Response):
    """The answer to a handshake: its `101 Switching Protocols` goes through the WSGI layers
    first, so the request is counted, timed and logged at its opening and gets the common
    headers (`X-Request-Id`, which the socket's runs log), which the transport writes into the
    101 (agentd/server/websocket.py). Then the socket lives on this thread; flask-sock's own
    answer at its end is dropped."""

    def __init__(self, session: Callable[[], Any]) -> None:
        super().__init__(status=101)
        self._session = session

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("101 Switching Protocols", [])
        self._session()
        return []


class _Keep:
    """Stands in for a blueprint: keeps the view flask-sock would register."""

    def __init__(self, into: list[Callable[..., Any]]) -> None:
        self.into = into

    def route(self, path: str, **_: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def keep(view: Callable[..., Any]) -> Callable[..., Any]:
            if not self.into:  # two first requests at once: either build serves
                self.into.append(view)
            return view

        return keep


def register_sockets(app: Flask) -> _LazySock:
    """Attach the agent socket and the diagnostic echo socket (flask-sock, loaded on first use)."""
    # Dead peers are noticed only when a write fails; pings every 25 s make sure one does.
    # Oversized frames are refused in the handler with an error frame, so the
    # transport limit is the largest frame a message of FRAME_LIMIT bytes can make.
    app.config.setdefault("SOCK_SERVER_OPTIONS", {"ping_interval": 25, "max_message_size": JSON_FRAME_LIMIT})
    sock = _LazySock()
    # Built per app: flask-sock registers routes on the blueprint as it decorates.
    bp = Blueprint("sockets", __name__)

    @bp.before_request
    def _check_agent() -> None:
        # Refuse unknown agents with a plain 404 before the upgrade happens.
        if request.view_args and "agent_id" in request.view_args:
            from agentd.api.routes_agents import agent

            agent(request.view_args["agent_id"])

    @sock.route("/api/agents/<agent_id>/ws", bp=bp)
    @doc("WebSocket: talk to an agent", tags="agents", websocket=True, ok=101, errors={
        400: "Not a WebSocket handshake, or refused by the request guard",
        503: "Too many concurrent streams"}, description=WS_DESCRIPTION)
    def agent_socket(ws, agent_id: str) -> None:  # type: ignore[no-untyped-def]
        kernel = current_app.extensions["agentd.kernel"]
        handle = kernel.agents.get(agent_id)
        slots = stream_slots()
        if not slots.acquire(blocking=False):
            ws.send(json.dumps({"type": "error", "content": "too many concurrent streams; try again shortly"}))
            return
        try:
            try:
                socket = AgentSocket(ws, kernel, handle, principal(), request.args.get("user") or None,
                                     request.args.get("session") or None, rechecker())
            except AgentdError as exc:  # a `user` or `session` no session can be named by
                ws.send(json.dumps({"type": "error", "content": exc.message}))
                return
            socket.serve()
        finally:
            slots.release()

    @sock.route("/api/_ws/echo", bp=bp)
    @doc("WebSocket: echo every frame back (diagnostic)", tags="system", websocket=True, ok=101,
         errors={400: "Not a WebSocket handshake"})
    def echo(ws) -> None:  # type: ignore[no-untyped-def]
        """Echo every frame back; used to check the WebSocket transport."""
        stopping = current_app.extensions["agentd.kernel"].stopping
        while not stopping.is_set():
            data = ws.receive(timeout=0.25)
            if data is not None:
                ws.send(data)
        going_away(ws)

    app.register_blueprint(bp)
    return sock
