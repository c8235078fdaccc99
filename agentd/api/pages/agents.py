"""Agents: list and spawn, the agent page with chat, session actions, approvals (memory: memory.py)."""

from __future__ import annotations

from typing import Any, Callable

from flask import render_template, request, url_for

from agentd.agents.loop import RunCancelled
from agentd.agents import manifest_edit
from agentd.agents.manager import MODES, UPLOAD_LIMIT
from agentd.agents.manifest import MANIFEST_LIMIT, PROFILES
from agentd.api.pages import bp, form_post, kernel, refused, see_other
from agentd.api.pages.confirm import ask_first
from agentd.api.pages.notes import see_other_with
from agentd.api.principal import principal, reachable, run_fields
from agentd.api.routes_agents import message_text
from agentd.api.runs import run_blocking
from agentd.errors import AgentdError, BadRequest, Conflict, NotFound, PayloadTooLarge

HISTORY_SHOWN = 50   # messages per page of the agent's history, newest page first (the 60 KB page budget)
PAGE_SIZE = 100      # agents per /agents page (a thousand rows make a slow, heavy page)


def _spend_by_agent() -> dict[str, float]:
    metering = kernel().metering
    start, end = metering.period(None, None)
    return {row["agent_id"]: row["spent_usd"] for row in metering.by_agent(start, end)}


def _page_number(name: str = "page") -> int:
    try:
        return max(1, int(request.args.get(name) or 1))
    except ValueError:
        return 1


def model_choices() -> list[str]:
    """The model picker's entries: `provider/model` for each catalogue model."""
    return [f"{m.provider}/{m.id}" for m in kernel().catalog.models()]


def _agents_page(status: int = 200, error: str = "", manifest: str = "", form: dict | None = None):
    agents = kernel().agents
    query = (request.args.get("q") or "").strip()
    handles = principal().visible(agents.handles())
    if query:
        handles = [h for h in handles if query.lower() in h.name.lower()]
    pages = max(1, -(-len(handles) // PAGE_SIZE))
    number = min(_page_number(), pages)
    first = (number - 1) * PAGE_SIZE
    # Only the rows shown are turned into list items (the costly part with many agents).
    items = [agents.list_item(h) for h in handles[first:first + PAGE_SIZE]]
    return render_template("agents.html", agents=items, total=len(handles), first=first, page=number,
                           pages=pages, query=query, spend=_spend_by_agent(), error=error,
                           manifest=manifest, form=form or {}, models=model_choices(), profiles=sorted(PROFILES),
                           modes=MODES, default=kernel().config.default_model), status


@bp.get("/agents")
def agents_list():
    return _agents_page()


@bp.post("/agents")
def agents_spawn():
    """Spawn from the form's fields, or from the raw TOML manifest when one is given."""
    form = {key: request.form.get(key, "") for key in ("name", "model", "profile", "mode", "system_prompt")}
    manifest = request.form.get("manifest_toml", "")
    k = kernel()
    try:
        if len(manifest.encode("utf-8")) > MANIFEST_LIMIT:
            raise PayloadTooLarge("manifest too large (max 1 MB)")
        if not manifest.strip():
            if "name" not in request.form:  # a client posting only the manifest, as to the API
                raise BadRequest("invalid request: manifest_toml is required")
            if not form["name"].strip():
                raise BadRequest("name is required (or give a TOML manifest)")
            if form["mode"] and form["mode"] not in MODES:
                raise BadRequest(f"mode must be one of {', '.join(MODES)}")
            manifest_text = manifest_edit.build(form["name"], form["model"], form["profile"], form["system_prompt"])
        else:
            manifest_text = manifest
        who = principal()
        handle = k.agents.spawn(manifest_text, None, who.key_id, who.check_spawn)
    except AgentdError as exc:
        # Shown inline above the form, which keeps what was typed.
        return _agents_page(exc.status, exc.message, manifest, form)
    if form["mode"] and form["mode"] != handle.mode:
        k.agents.set_mode(handle, form["mode"])
    # The same warnings POST /api/agents answers (a missing provider key, unknown keys).
    warnings = k.agents.spawn_warnings(handle)
    return see_other_with("pages.agent_page", [f"agent {handle.name} spawned"] + warnings, ok=not warnings,
                          agent_id=handle.id)


def _edit_page(handle: Any, status: int = 200, error: str = "", manifest: str | None = None):
    k = kernel()
    return render_template("agent_edit.html", agent=k.agents.summary(handle),
                           manifest=handle.manifest.toml_text if manifest is None else manifest,
                           model=f"{handle.provider}/{handle.model}", models=model_choices(), error=error), status


@bp.get("/agents/<agent_id>/edit")
def agent_edit(agent_id: str):
    return _edit_page(kernel().agents.get(agent_id))


@form_post("/agents/<agent_id>/manifest", "pages.agent_edit", keeps=("manifest_toml",))
def agent_manifest(agent_id: str):
    """Replace the manifest as PUT /api/agents/{id}/manifest does."""
    agents = kernel().agents
    handle = agents.get(agent_id)
    manifest = request.form.get("manifest_toml", "")
    try:
        if len(manifest.encode("utf-8")) > MANIFEST_LIMIT:
            raise PayloadTooLarge("manifest too large (max 1 MB)")
        warnings = agents.update_manifest(handle, manifest, principal().key_id)
    except AgentdError as exc:
        return _edit_page(handle, exc.status, exc.message, manifest)
    return see_other_with("pages.agent_page", [f"agent {handle.name}: manifest saved"] + warnings,
                          ok=not warnings, agent_id=handle.id)


@form_post("/agents/<agent_id>/model", "pages.agent_edit")
def agent_model(agent_id: str):
    """Set the model as PUT /api/agents/{id}/model does."""
    agents = kernel().agents
    handle = agents.get(agent_id)
    try:
        warnings = agents.set_model(handle, request.form.get("model", ""), principal().key_id)
    except AgentdError as exc:
        return see_other_with("pages.agent_edit", [exc.message], ok=False, agent_id=handle.id)
    return see_other_with("pages.agent_page", [f"agent {handle.name}: model set to {handle.provider}/{handle.model}"]
                          + warnings, ok=not warnings, agent_id=handle.id)


def _agent_page(agent_id: str, status: int = 200, error: str = "", draft: str = ""):
    k = kernel()
    handle = k.agents.get(agent_id)
    detail = k.agents.detail(handle)
    session = k.agents.session(handle, _own_session(handle))
    messages = session["messages"]
    # Page 1 holds the newest HISTORY_SHOWN messages, page 2 the ones before them, ...
    pages = max(1, -(-len(messages) // HISTORY_SHOWN))
    number = min(_page_number(), pages)
    end = len(messages) - (number - 1) * HISTORY_SHOWN
    start = max(0, end - HISTORY_SHOWN)
    pending = [a for a in k.approvals.pending() if a["agent_id"] == handle.id]
    tool_groups = [(origin.replace("mcp:", "MCP server ", 1), names)
                   for origin, names in k.agents.tools_by_origin(handle).items()]
    return render_template("agent.html", agent=detail, session=session, messages=messages[start:end],
                           tool_groups=tool_groups,
                           hidden=start, newer=len(messages) - end, page=number, modes=MODES,
                           approvals=pending, error=error, draft=draft,
                           spend=_spend_by_agent().get(handle.id, 0.0),
                           skills=[s.name for s in k.skills.permitted(handle.manifest.data["skills"])]), status


@bp.get("/agents/<agent_id>")
def agent_page(agent_id: str):
    return _agent_page(agent_id)


@form_post("/agents/<agent_id>/message", "pages.agent_page", keeps=("message",))
def agent_message(agent_id: str):
    """The no-JavaScript chat: run the message (as POST /api/agents/{id}/message), then 303 back.

    A file chosen in the form is stored as POST /api/agents/{id}/upload stores it and
    attached to the message (images reach a vision model as image parts)."""
    k = kernel()
    handle = k.agents.get(agent_id)
    text = request.form.get("message", "")
    try:
        text = message_text({"message": text})
        attachments = _attachments(handle)
        try:
            run_blocking(k, handle, text, attachments, run=run_fields(principal(), handle, own_session=True))
        except RunCancelled:
            raise Conflict("run cancelled: the agent was stopped before it answered") from None
    except AgentdError as exc:
        return refused(_agent_page(agent_id, exc.status, exc.message, draft=text), exc)
    return see_other("pages.agent_page", agent_id=handle.id, _anchor="latest")


def _attachments(handle: Any) -> list[dict[str, str]]:
    """The chat form's file, saved to the agent's uploads, as the message's attachments."""
    upload = request.files.get("attachment")
    if upload is None or not upload.filename:
        return []
    saved = kernel().agents.save_upload(handle, upload.filename,
                                        (upload.mimetype or "application/octet-stream").lower(),
                                        upload.read(UPLOAD_LIMIT + 1))
    return [{"file_id": saved["file_id"]}]


def _agent_action(agent_id: str, action: Callable[[Any, Any], str], refusal_on_page: bool = True):
    """Run one session action from the agent page's forms, then show the agent again with
    the line `action` answers.

    With `refusal_on_page`, an AgentdError re-renders the agent page with its message and
    status; otherwise it reaches the ordinary error handler.
    """
    agents = kernel().agents
    handle = agents.get(agent_id)
    try:
        said = action(agents, handle)
    except AgentdError as exc:
        if not refusal_on_page:
            raise
        return _agent_page(agent_id, exc.status, exc.message)
    return see_other_with("pages.agent_page", [f"agent {handle.name}: {said}"], agent_id=handle.id)


def _set_mode(agents: Any, handle: Any) -> str:
    mode = request.form.get("mode", "")
    agents.set_mode(handle, mode)
    return f"mode set to {mode}"


def _stop(agents: Any, handle: Any) -> str:
    return "its run was stopped" if agents.stop(handle) else "nothing was running"


def _compact(agents: Any, handle: Any) -> str:
    return agents.compact(handle)["message"]


@form_post("/agents/<agent_id>/mode", "pages.agent_page")
def agent_mode(agent_id: str):
    return _agent_action(agent_id, _set_mode)


@form_post("/agents/<agent_id>/stop", "pages.agent_page")
def agent_stop(agent_id: str):
    return _agent_action(agent_id, _stop, refusal_on_page=False)


@form_post("/agents/<agent_id>/compact", "pages.agent_page")
def agent_compact(agent_id: str):
    return _agent_action(agent_id, _compact)


@bp.route("/agents/<agent_id>/reset", methods=["GET", "POST"])
def agent_reset(agent_id: str):
    handle = kernel().agents.get(agent_id)
    asked = ask_first(f"Reset the session of {handle.name}?", "The conversation so far is cleared; the agent "
                      "starts the next message with no history. This cannot be undone.", "Reset the session",
                      url_for("pages.agent_page", agent_id=handle.id))
    if asked is not None:
        return asked
    return _agent_action(agent_id, _reset, refusal_on_page=False)


def _own_session(handle: Any) -> str | None:
    """The session the page's login talks in: a scoped key's own, else the agent's (None)."""
    return run_fields(principal(), handle, own_session=True).get("session_id")


def _reset(agents: Any, handle: Any) -> str:
    own = _own_session(handle)
    if own is None:
        agents.reset_session(handle)
        return "session reset"
    try:
        agents.delete_session(own)
    except NotFound:
        pass  # never talked in: nothing to clear
    return "session reset"


@bp.route("/agents/<agent_id>/kill", methods=["GET", "POST"])
def agent_kill(agent_id: str):
    agents = kernel().agents
    handle = agents.get(agent_id)
    asked = ask_first(f"Kill agent {handle.name}?", "The agent stops, its session and memory go with it, and it "
                      "leaves the agent list. This cannot be undone.", f"Kill {handle.name}",
                      url_for("pages.agent_page", agent_id=handle.id))
    if asked is not None:
        return asked
    agents.kill(handle)
    return see_other_with("pages.agents_list", [f"agent {handle.name} was killed"])


@bp.get("/approvals")
def approvals():
    return render_template("approvals.html", approvals=reachable(kernel().approvals.pending()))


@form_post("/approvals/<approval_id>/<decision>", "pages.approvals")
def approval_decide(approval_id: str, decision: str):
    queue = kernel().approvals
    if decision not in ("approve", "reject"):
        raise BadRequest("decision must be approve or reject")
    ok = True
    try:
        decided = queue.approve(approval_id) if decision == "approve" else queue.reject(approval_id)
        said = [f"{decided.agent_name}: {decided.tool} {decided.decision}"]
    except (NotFound, Conflict) as exc:  # decided meanwhile: in a chat, the API, another tab, a timeout
        why = exc.message if isinstance(exc, Conflict) else "it was decided elsewhere or timed out"
        said, ok = [f"approval {approval_id} is no longer pending: {why}"], False
    back = request.form.get("back", "")
    if back.startswith("agent:"):
        return see_other_with("pages.agent_page", said, ok=ok, agent_id=back[6:])
    return see_other_with("pages.approvals", said, ok=ok)
