"""Who a request acts as (once per request, in `flask.g`) and what it may do.

`principal()` is the admin (the configured `api_key`, a dashboard login with it, or a
keyless daemon's loopback client) or one scoped key (agentd/apikeys.py). The auth hook
(agentd/api/middleware.py) resolves it, then `authorize` refuses what the key may not do:
the route's scope (agentd/api/scopes.py, 403 naming the scope), an agent outside its list
(404, as if absent), its rate limit (429). An entry point outside that table (an MCP tool
call, an A2A task) checks with the same two calls:

    who = principal()
    who.require("message")          # 403 naming the missing scope
    handle = who.reach(handle)      # 404 for an agent outside the key's list

and starts its run with `run_fields(who, handle, user=...)` (agentd/apikeys.py): the key that pays and the
person whose session it is.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable

from flask import Response, current_app, g, request

from agentd import hmacs
from agentd.api import dashauth
from agentd.api.errors import error_response
from agentd.api.ratelimit import GcraLimiter
from agentd.api.scopes import scope_of
from agentd.apikeys import TOKEN_PREFIX
from agentd.principals import ADMIN, Principal, run_fields  # noqa: F401 - the routes' import
from agentd.config import Config
from agentd.errors import AgentdError, NotFound, Unauthorized
from agentd.tasks.board import TASK_AGENTS

_UNSET = object()


def presented_key() -> str | None:
    """The key a request carries: `Authorization: Bearer`, `X-API-Key` or `?token=`."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":  # the scheme is case-insensitive (RFC 7235)
        return auth[7:].strip()
    if "X-API-Key" in request.headers:
        return request.headers["X-API-Key"].strip()
    return request.args.get("token")


def _is_loopback(addr: str | None) -> bool:
    from agentd.api.middleware import is_loopback

    return is_loopback(addr)


def _resolve(config: Config) -> Principal | None:
    """The request's principal; None when it brings no (valid) credential. A scoped key
    that is wrong, disabled or expired raises Unauthorized saying which."""
    if not config.api_key:
        return ADMIN if _is_loopback(request._get_current_object().remote_addr) else None
    presented = presented_key()
    if presented is None:
        # The dashboard's own pages and fetch/SSE calls carry its login cookie instead of the key.
        session = dashauth.current_session()
        if not session or not session.get("auth"):
            return None
        key_id = session.get("key")
        if not key_id:
            return ADMIN
        return current_app.extensions["agentd.kernel"].keys.principal(key_id, str(session.get("login", "")))
    if hmacs.same(presented, config.api_key):
        return ADMIN
    if presented.startswith(TOKEN_PREFIX):
        return current_app.extensions["agentd.kernel"].keys.verify(presented)
    return None


def current(config: Config) -> Principal | None:
    """The request's principal, resolved once (Unauthorized re-raised each time asked)."""
    request_g = g._get_current_object()  # (each use of the proxy looks it up again)
    found = request_g.get("principal", _UNSET)
    if found is _UNSET:
        try:
            found = _resolve(config)
        except Unauthorized as exc:
            found = exc
        request_g.principal = found
    if isinstance(found, Unauthorized):
        raise found
    return found  # type: ignore[return-value]


def rechecker() -> Callable[[], Principal] | None:
    """For a connection that outlives its request (a WebSocket): what resolves its scoped
    key again, as the request's was resolved, raising Unauthorized once the key is deleted,
    disabled, expired or (for a token) rotated. None for the admin."""
    who = principal()
    if who.is_admin:
        return None
    keys = current_app.extensions["agentd.kernel"].keys
    token = presented_key()
    if token is not None:
        return lambda: keys.verify(token)

    session = dashauth.current_session() or {}
    login = str(session.get("login", ""))

    def by_login() -> Principal:  # a dashboard login with the key
        found = keys.principal(who.key_id, login)
        if found is None:
            raise Unauthorized(f"API key '{who.name}' is no longer valid")
        return found
    return by_login


def principal() -> Principal:
    """The principal of the current request (admin when none was resolved: a route only
    runs after the auth hook let its request through)."""
    found = g._get_current_object().get("principal")
    return found if isinstance(found, Principal) else ADMIN


class KeyLimits:
    """Per-key request rates: in memory on a database of its own, counted in the database
    when several daemons share it (so spreading requests over daemons gains nothing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limiters: dict[str, tuple[int, GcraLimiter]] = {}

    def hit(self, who: Principal) -> float:
        """0 when the request may proceed, else seconds until one would be allowed."""
        rpm = who.rate_limit_per_minute
        if not rpm or who.is_admin:
            return 0.0
        kernel = current_app.extensions["agentd.kernel"]
        if kernel.store.shared:
            return kernel.keys.shared_hit(who.key_id, rpm)
        with self._lock:
            found = self._limiters.get(who.key_id)
            if found is None or found[0] != rpm:
                found = self._limiters[who.key_id] = (rpm, GcraLimiter(rpm / 60.0, rpm))
        decision = found[1].hit(who.key_id)
        return 0.0 if decision.allowed else max(decision.retry_after, 0.001)


def step_agents(steps: list[dict[str, Any]]) -> list[str]:
    """The agents (ids or names) a workflow's steps name."""
    return [ref for step in steps if step.get("agent")
            for ref in [next(iter(step["agent"].values()), None)] if isinstance(ref, str) and ref]


def _workflow_agents(kernel: Any, workflow_id: str) -> list[str]:
    return step_agents(kernel.workflows.get(workflow_id)["steps"])


def _job_workflow(job: dict[str, Any]) -> str | None:
    """The workflow a cron job's action runs (None: it runs an agent)."""
    action = job.get("action") or {}
    return action.get("workflow_id") if action.get("kind") == "workflow_run" else None


def _owners_in_path(kernel: Any, view_args: dict[str, Any]) -> tuple[list[str], str] | None:
    """(agent ids or names, what is not found) for a cron job, trigger, approval,
    task, workflow or workflow run named in the path (a task names up to three agents: for
    whom, by whom, by whom posted; a workflow those of its steps)."""
    try:
        if "workflow_id" in view_args:
            return _workflow_agents(kernel, view_args["workflow_id"]), "workflow not found"
        if "run_id" in view_args:
            run = kernel.workflows.run_detail(view_args["run_id"])
            return _workflow_agents(kernel, run["workflow_id"]), "workflow run not found"
        if "approval_id" in view_args:
            # Decided ones too: until its run takes the decision, deciding again answers 409,
            # which would tell a key that an approval outside its list exists.
            approval = kernel.approvals.find(view_args["approval_id"])
            return ([approval.agent_id], "approval not found") if approval is not None else None
        if "job_id" in view_args:
            job = kernel.cron.get_raw(view_args["job_id"])
            workflow_id = _job_workflow(job)
            try:
                steps = _workflow_agents(kernel, workflow_id) if workflow_id else []
            except AgentdError:
                steps = []  # its workflow deleted meanwhile: the job's own agent decides
            return [job.get("agent_id") or "", *steps], "cron job not found"
        if "trigger_id" in view_args:
            return [kernel.triggers.get(view_args["trigger_id"])["agent_id"]], "trigger not found"
        if "task_id" in view_args:
            task = kernel.tasks.get(view_args["task_id"])
            return [task[f] for f in TASK_AGENTS], "task not found"
    except AgentdError:
        pass  # none: the route answers its own 404 or 400
    return None


def _reach_owner(who: Principal, view_args: dict[str, Any]) -> None:
    """A job, trigger, approval or task of an agent outside the key's list is as absent as one never made."""
    kernel = current_app.extensions["agentd.kernel"]
    owners = _owners_in_path(kernel, view_args)
    if owners is None:
        return
    for owner in filter(None, owners[0]):
        handle = kernel.agents.find(owner)
        if handle is not None and not who.may_reach(handle):
            try:
                who.reach(handle)  # (audited)
            except NotFound:
                raise NotFound(owners[1]) from None


def reach_agent(ref: Any, unknown: Callable[[str], AgentdError] | None = None) -> None:
    """Refuse `ref` (an id or name from a request body) when it names an agent outside the
    key's list: 404 `agent not found`, or `unknown(ref)` where the route words an unknown
    agent otherwise. Anything else is left to the route's own checks."""
    who = principal()
    if who.agents and isinstance(ref, str) and ref:
        handle = current_app.extensions["agentd.kernel"].agents.find(ref)
        if handle is not None:
            try:
                who.reach(handle)  # (audited)
            except NotFound:
                if unknown is None:
                    raise
                raise unknown(ref) from None


def reachable_workflows(rows: list[dict[str, Any]], field: str | Callable[[dict[str, Any]], str | None] = "id"
                        ) -> list[dict[str, Any]]:
    """The workflows (or runs: `field="workflow_id"`; or what `field(row)` says runs one, None
    for none) a key limited to some agents may see: those whose steps name only its agents."""
    who = principal()
    if not who.agents:
        return rows
    kernel = current_app.extensions["agentd.kernel"]
    seen: dict[str, bool] = {}

    def ok(workflow_id: str | None) -> bool:
        if workflow_id is None:
            return True
        if workflow_id not in seen:
            try:
                refs = _workflow_agents(kernel, workflow_id)
            except AgentdError:
                refs = []
            handles = [kernel.agents.find(ref) for ref in refs]
            seen[workflow_id] = all(h is None or who.may_reach(h) for h in handles)
        return seen[workflow_id]

    return [r for r in rows if ok(field(r) if callable(field) else r[field])]


def reachable_jobs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cron jobs a key limited to some agents may see: of its agents, and running no
    workflow it may not see."""
    return reachable_workflows(reachable(rows), _job_workflow)


def reachable(rows: list[dict[str, Any]], *fields: str) -> list[dict[str, Any]]:
    """The rows a key limited to some agents may see: those whose agent fields (`agent_id`
    unless named) name only its agents, or no agent."""
    return principal().seen_rows(rows, current_app.extensions["agentd.kernel"].agents.handles,
                                 fields or ("agent_id",))


def _is_id(ref: str) -> bool:
    try:
        uuid.UUID(ref)
    except ValueError:
        return False
    return True


def authorize(who: Principal, limits: KeyLimits,
              answer: Callable[..., Response] = error_response) -> Response | None:
    """The route's scope, the agent in its path, the key's rate limit: a refusal or None.

    `answer(status, message, code=..., retry_after=...)` makes the refusal's response."""
    if who.is_admin:
        return None
    try:
        scope = scope_of(request.endpoint)
        if scope is not None:
            who.require(scope)
        agent_id = (request.view_args or {}).get("agent_id")
        # Only an id: a name where the id belongs is the route's 400 (the dashboard has turned
        # the names of the key's agents into ids), so a hidden agent's name answers as a
        # name no agent has.
        if agent_id and _is_id(agent_id):
            handle = current_app.extensions["agentd.kernel"].agents.find(agent_id)
            if handle is not None:
                who.reach(handle)
        if who.agents:
            _reach_owner(who, request.view_args or {})
    except AgentdError as exc:
        return answer(exc.status, exc.message)
    wait = limits.hit(who)
    if wait > 0:
        current_app.extensions["agentd.kernel"].keys.refused(who, "rate limit", {})
        return answer(429, f"rate limit exceeded: API key '{who.name}' allows "
                                   f"{who.rate_limit_per_minute} requests a minute",
                              code="rate_limit_exceeded", retry_after=wait)
    return None
