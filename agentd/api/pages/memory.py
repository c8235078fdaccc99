"""An agent's memory: search by meaning, add, edit and delete fragments, the key-value
entries, the knowledge graph (entities and their relations), export, import, consolidate.

Every form calls what the memory API calls (kernel.memory, kernel.kv) and answers 303 with
a message (agentd/api/pages/notes.py), so a refresh never sends anything again.
"""

from __future__ import annotations

import json
from typing import Any

from flask import Response, current_app, render_template, request, url_for

from agentd import jsonsafe
from agentd.api import body
from agentd.api.pages import bp, form_post, kernel
from agentd.api.principal import principal
from agentd.api.pages.confirm import ask_first
from agentd.api.pages.notes import see_other_with
from agentd.errors import AgentdError, BadRequest, NotFound
from agentd.memory.kv import MAX_KEY_LENGTH

MEMORIES_SHOWN = 50
KV_SHOWN = 100        # key-value entries per page of the memory page (700 entries were ~57 KB)
FOUND_SHOWN = 10      # fragments a search shows
ENTITIES_SHOWN = 200  # entities per page of the graph list


def _page_number(name: str = "page") -> int:
    try:
        return max(1, int(request.args.get(name) or 1))
    except ValueError:
        return 1


def _memory_service(k: Any = None) -> Any:
    """The daemon's memory service, or None where a daemon has none."""
    service = getattr(k or kernel(), "memory", None)
    return service if callable(getattr(service, "page", None)) else None


def _memories(k: Any, agent_id: str, offset: int, owner: str | None) -> dict[str, Any] | None:
    """A page of semantic memories (GET /api/memory/agents/{id}/memories) when the daemon
    has the memory service, else None."""
    service = _memory_service(k)
    return None if service is None else service.page(agent_id, MEMORIES_SHOWN, offset, owner)


def _done(agent_id: str, lines: list[str], ok: bool = True, endpoint: str = "pages.agent_memory",
          **values: Any) -> Response:
    return see_other_with(endpoint, lines, ok=ok, agent_id=agent_id, **values)


def _typed(*fields: str) -> dict[str, str]:
    """What a refused form held, to fill it with again."""
    return {name: request.form.get(name, "") for name in fields}


@bp.get("/agents/<agent_id>/memory")
def agent_memory(agent_id: str):
    k = kernel()
    handle = k.agents.get(agent_id)
    service = _memory_service()
    page = _page_number()
    memories = found = None
    search_error = ""
    query = (request.args.get("q") or "").strip()
    if service is not None:
        owner = principal().label
        memories = _memories(k, handle.id, (page - 1) * MEMORIES_SHOWN, owner)
        if memories["total"] and (page - 1) * MEMORIES_SHOWN >= memories["total"]:
            page = -(-memories["total"] // MEMORIES_SHOWN)  # past the end: the last page
            memories = _memories(k, handle.id, (page - 1) * MEMORIES_SHOWN, owner)
        if query:
            try:
                found = service.recall(handle.id, query, FOUND_SHOWN, owner=owner)
            except AgentdError as exc:
                search_error = exc.message
    json_url = (url_for("memory.list_memories", agent_id=handle.id)
                if memories is not None and "memory.list_memories" in current_app.view_functions else "")
    entries = sorted(k.kv.all(handle.id).items())
    kv_pages = max(1, -(-len(entries) // KV_SHOWN))
    kv_page = min(_page_number("kv_page"), kv_pages)
    kv_key = request.args.get("kv_key", "")
    kv_value = ""
    if kv_key:
        present, value = k.kv.get(handle.id, kv_key)
        kv_value = json.dumps(value, ensure_ascii=False, indent=1) if present else ""
    return render_template("memory.html", agent=k.agents.summary(handle),
                           kv=entries[(kv_page - 1) * KV_SHOWN:kv_page * KV_SHOWN], kv_total=len(entries),
                           kv_page=kv_page, kv_pages=kv_pages, kv_key=kv_key, kv_value=kv_value,
                           memories=memories, memories_json=json_url, query=query, found=found,
                           search_error=search_error,
                           offset=(page - 1) * MEMORIES_SHOWN, page=page, per_page=MEMORIES_SHOWN)


def _required_service() -> Any:
    service = _memory_service()
    if service is None:
        raise AgentdError("semantic memory is not available on this daemon", status=503)
    return service


# -- fragments ----------------------------------------------------------------------------------

@form_post("/agents/<agent_id>/memory/fragments", "pages.agent_memory", keeps=("content", "scope"))
def memory_add(agent_id: str):
    handle = kernel().agents.get(agent_id)
    form = request.form
    try:
        result = _required_service().remember(handle.id, form.get("content", ""), None,
                                              form.get("scope") or None)
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False, typed=_typed("content", "scope"), _anchor="memories")
    said = "merged into a fragment it repeats" if result["merged"] else "remembered"
    return _done(handle.id, [f"fragment {said}"], _anchor="memories")


@bp.get("/agents/<agent_id>/memory/fragments/<memory_id>")
def memory_fragment(agent_id: str, memory_id: str):
    handle = kernel().agents.get(agent_id)
    fragment = _required_service().get(handle.id, memory_id, principal().label)
    return render_template("memory_fragment.html", agent=kernel().agents.summary(handle), fragment=fragment)


@bp.post("/agents/<agent_id>/memory/fragments/<memory_id>")
def memory_edit(agent_id: str, memory_id: str):
    handle = kernel().agents.get(agent_id)
    form = request.form
    try:
        _required_service().update(handle.id, memory_id, form.get("content", ""), form.get("scope") or None,
                                   owner=principal().label)
    except AgentdError as exc:
        if exc.status == 404:
            raise
        return _done(handle.id, [exc.message], ok=False, endpoint="pages.memory_fragment", memory_id=memory_id,
                     typed=_typed("content", "scope"))
    return _done(handle.id, ["fragment saved"], _anchor="memories")


@bp.route("/agents/<agent_id>/memory/fragments/<memory_id>/delete", methods=["GET", "POST"])
def memory_delete(agent_id: str, memory_id: str):
    handle = kernel().agents.get(agent_id)
    asked = ask_first(f"Delete this memory fragment of {handle.name}?", "The agent no longer recalls it. This "
                      "cannot be undone.", "Delete the fragment",
                      url_for("pages.memory_fragment", agent_id=handle.id, memory_id=memory_id))
    if asked is not None:
        return asked
    try:
        _required_service().delete(handle.id, memory_id, principal().label)
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False)
    return _done(handle.id, ["fragment deleted"], _anchor="memories")


# -- key-value entries ----------------------------------------------------------------------------

def _kv_key(key: str) -> str:
    """The typed key, refused as the API refuses it (an empty key names no entry)."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise BadRequest(f"key must be 1-{MAX_KEY_LENGTH} characters")
    return key


def _kv_value(text: str) -> Any:
    """The typed value: JSON when it parses as JSON, else the text itself as a string. JSON
    the API's PUT refuses (NaN, Infinity, a lone surrogate, too deep) is refused alike."""
    try:
        return body.portable_json(text)
    except json.JSONDecodeError:
        return text


@form_post("/agents/<agent_id>/memory/kv", "pages.agent_memory", keeps=("key", "value"))
def memory_kv_set(agent_id: str):
    handle = kernel().agents.get(agent_id)
    key = request.form.get("key", "")
    try:
        kernel().kv.set(handle.id, _kv_key(key), _kv_value(request.form.get("value", "")))
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False, typed=_typed("key", "value"), _anchor="kv")
    return _done(handle.id, [f"key {key} saved"], _anchor="kv")


@bp.route("/agents/<agent_id>/memory/kv/delete", methods=["GET", "POST"])
def memory_kv_delete(agent_id: str):
    handle = kernel().agents.get(agent_id)
    key = request.values.get("key", "")
    asked = ask_first(f"Delete key {key} of {handle.name}?", "The entry and its value are deleted. This cannot "
                      "be undone.", "Delete the entry", url_for("pages.agent_memory", agent_id=handle.id,
                                                                 _anchor="kv"))
    if asked is not None:
        return asked
    try:
        if not kernel().kv.delete(handle.id, _kv_key(key)):
            raise NotFound(f"key not found: {key}")
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False, _anchor="kv")
    return _done(handle.id, [f"key {key} deleted"], _anchor="kv")


# -- export, import, consolidate -----------------------------------------------------------------

@bp.get("/agents/<agent_id>/memory/export")
def memory_export(agent_id: str):
    """GET /api/memory/agents/{id}/export's document, as a file to keep."""
    handle = kernel().agents.get(agent_id)
    document = _required_service().export(handle.id, principal().label)
    response = Response(json.dumps(document, ensure_ascii=False), mimetype="application/json")
    response.headers["Content-Disposition"] = f'attachment; filename="memory-{handle.name}.json"'
    return response


@form_post("/agents/<agent_id>/memory/import", "pages.agent_memory")
def memory_import(agent_id: str):
    handle = kernel().agents.get(agent_id)
    upload = request.files.get("document")
    try:
        if upload is None or not upload.filename:
            raise BadRequest("choose an export file (JSON) to import")
        try:
            document = jsonsafe.loads(upload.read())
        except ValueError as exc:
            raise BadRequest(f"the file is not JSON: {exc}") from None
        result = _required_service().import_doc(handle.id, document)
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False)
    lines = [f"imported {result['memories_imported']} fragment(s), {result['entities_imported']} entit(ies), "
             f"{result['relations_imported']} relation(s)"]
    lines += [f"not imported: {error}" for error in result["errors"][:10]]
    return _done(handle.id, lines, ok=not result["errors"])


@form_post("/agents/<agent_id>/memory/consolidate", "pages.agent_memory")
def memory_consolidate(agent_id: str):
    handle = kernel().agents.get(agent_id)
    try:
        result = _required_service().consolidate(handle.id)
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False)
    return _done(handle.id, [f"consolidated: {result['memories_merged']} merged, "
                             f"{result['memories_decayed']} decayed"])


# -- the knowledge graph ------------------------------------------------------------------------

@bp.get("/agents/<agent_id>/memory/graph")
def memory_graph(agent_id: str):
    handle = kernel().agents.get(agent_id)
    entities, relations = _required_service().graph.export(handle.id)
    degree: dict[str, int] = {}
    for r in relations:
        degree[r["source"]] = degree.get(r["source"], 0) + 1
        degree[r["target"]] = degree.get(r["target"], 0) + 1
    pages = max(1, -(-len(entities) // ENTITIES_SHOWN))
    page = min(_page_number(), pages)
    names = {e["id"]: e["name"] for e in entities}
    return render_template("memory_graph.html", agent=kernel().agents.summary(handle),
                           entities=entities[(page - 1) * ENTITIES_SHOWN:page * ENTITIES_SHOWN],
                           total=len(entities), relations=relations, names=names, degree=degree, page=page,
                           pages=pages)


@bp.get("/agents/<agent_id>/memory/graph/<entity_id>")
def memory_entity(agent_id: str, entity_id: str):
    handle = kernel().agents.get(agent_id)
    service = _required_service()
    entities, _ = service.graph.export(handle.id)
    entity = next((e for e in entities if e["id"] == entity_id), None)
    if entity is None:
        raise AgentdError(f"entity not found: {entity_id}", status=404)
    outgoing = service.query_graph(handle.id, source=entity_id)
    incoming = service.query_graph(handle.id, target=entity_id)
    return render_template("memory_entity.html", agent=kernel().agents.summary(handle), entity=entity,
                           outgoing=outgoing, incoming=incoming)


@form_post("/agents/<agent_id>/memory/graph/entities", "pages.memory_graph", keeps=("name", "entity_type"))
def memory_entity_add(agent_id: str):
    handle = kernel().agents.get(agent_id)
    form = request.form
    try:
        _required_service().add_entity(handle.id, form.get("entity_type", ""), form.get("name", ""))
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False, endpoint="pages.memory_graph",
                     typed=_typed("name", "entity_type"))
    return _done(handle.id, [f"entity {form.get('name', '').strip()} saved"], endpoint="pages.memory_graph")


@form_post("/agents/<agent_id>/memory/graph/relations", "pages.memory_graph",
           keeps=("source", "relation", "target"))
def memory_relation_add(agent_id: str):
    handle = kernel().agents.get(agent_id)
    form = request.form
    try:
        _required_service().add_relation(handle.id, form.get("source", ""), form.get("relation", ""),
                                         form.get("target", ""))
    except AgentdError as exc:
        return _done(handle.id, [exc.message], ok=False, endpoint="pages.memory_graph",
                     typed=_typed("source", "relation", "target"))
    return _done(handle.id, [f"relation {form.get('source')} {form.get('relation')} {form.get('target')} saved"],
                 endpoint="pages.memory_graph")
