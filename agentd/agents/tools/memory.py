"""memory_store / memory_recall: the agent's own key-value memory; memory_remember /
memory_search (semantic memory) and knowledge_* (the knowledge graph)."""

from __future__ import annotations

import json
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.errors import AgentdError


@tool("memory_store", "Remember a value under a key (persists across sessions and restarts).",
      {"key": {"type": "string", "description": "Key"}, "value": {"description": "Any JSON value"}},
      ("key", "value"))
def memory_store(ctx: ToolContext, args: dict[str, Any]) -> str:
    _call(ctx.require_ops().kv_set, ctx.agent_id, args["key"], args["value"])
    return f"stored {args['key']}"


@tool("memory_recall", "Recall the value stored under a key.", {"key": {"type": "string", "description": "Key"}},
      ("key",), read_only=True)
def memory_recall(ctx: ToolContext, args: dict[str, Any]) -> str:
    found, value = ctx.require_ops().kv_get(ctx.agent_id, args["key"])
    if not found:
        return f"no value stored under {args['key']}"
    return value if isinstance(value, str) else json.dumps(value)


# -- semantic memory and the knowledge graph (agentd/memory/service.py) ------------------------
def _memory(ctx: ToolContext) -> Any:
    return ctx.require_ops().memory_service()


def _call(fn: Any, *args: Any) -> Any:
    # Validation errors (BadRequest/NotFound) reach the model as tool errors, not as failures.
    try:
        return fn(*args)
    except AgentdError as exc:
        raise ToolError(exc.message) from None


@tool("memory_remember", "Remember a fact by meaning (semantic memory). Near-duplicates are merged.",
      {"content": {"type": "string", "description": "The fact, in one or two sentences"},
       "scope": {"type": "string", "description": "semantic (default), episodic, procedural, preferences, "
                                                   "observations"},
       "metadata": {"type": "object", "description": "Key-value tags (optional)"},
       "confidence": {"type": "number", "description": "0.0-1.0 (default 1.0)"}},
      ("content",))
def memory_remember(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = _call(_memory(ctx).remember, ctx.agent_id, args["content"], "inference", args.get("scope"),
                   args.get("metadata"), args.get("confidence"))
    return f"{'merged into' if result['merged'] else 'remembered as'} memory {result['id']}"


@tool("memory_search", "Search your semantic memory by meaning; returns the closest facts with scores.",
      {"query": {"type": "string", "description": "What you want to remember"},
       "limit": {"type": "integer", "description": "How many (default 5, max 100)"},
       "scope": {"type": "string", "description": "Only this scope (optional)"}},
      ("query",), read_only=True)
def memory_search(ctx: ToolContext, args: dict[str, Any]) -> str:
    flt = {"scope": args["scope"]} if args.get("scope") else None
    found = _call(_memory(ctx).recall, ctx.agent_id, args["query"], args.get("limit"), None, flt)
    if not found:
        return "no memories found"
    return json.dumps([{"id": f["id"], "content": f["content"], "score": f["score"], "scope": f["scope"],
                        "created_at": f["created_at"]} for f in found], ensure_ascii=False)


@tool("knowledge_add_entity", "Add an entity (person, organization, project, concept, event, location, document, "
      "tool, or a custom type) to your knowledge graph.",
      {"name": {"type": "string", "description": "Display name"},
       "entity_type": {"type": "string", "description": "Entity type"},
       "properties": {"type": "object", "description": "Key-value properties (optional)"}},
      ("name", "entity_type"), family="knowledge")
def knowledge_add_entity(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = _call(_memory(ctx).add_entity, ctx.agent_id, args["entity_type"], args["name"], args.get("properties"))
    return f"entity {args['name']} has id {result['id']}"


@tool("knowledge_add_relation", "Link two entities (by id or name) in your knowledge graph.",
      {"source": {"type": "string", "description": "Source entity id or name"},
       "relation": {"type": "string", "description": "works_at, knows_about, related_to, depends_on, owned_by, "
                                                      "created_by, located_in, part_of, uses, produces, or custom"},
       "target": {"type": "string", "description": "Target entity id or name"},
       "confidence": {"type": "number", "description": "0.0-1.0 (default 1.0)"},
       "properties": {"type": "object", "description": "Key-value properties (optional)"}},
      ("source", "relation", "target"), family="knowledge")
def knowledge_add_relation(ctx: ToolContext, args: dict[str, Any]) -> str:
    result = _call(_memory(ctx).add_relation, ctx.agent_id, args["source"], args["relation"], args["target"],
                   args.get("properties"), args.get("confidence"))
    return f"relation {args['source']} {args['relation']} {args['target']} has id {result['id']}"


@tool("knowledge_query", "Query your knowledge graph by source, relation and/or target, following relations up "
      "to max_depth hops.",
      {"source": {"type": "string", "description": "Source entity id or name (optional)"},
       "relation": {"type": "string", "description": "Relation type (optional)"},
       "target": {"type": "string", "description": "Target entity id or name (optional)"},
       "max_depth": {"type": "integer", "description": "Hops to follow (default 1, at most 16)"}},
      read_only=True, family="knowledge")
def knowledge_query(ctx: ToolContext, args: dict[str, Any]) -> str:
    matches = _call(_memory(ctx).query_graph, ctx.agent_id, args.get("source"), args.get("relation"),
                    args.get("target"), args.get("max_depth"))
    if not matches:
        return "no matches"
    return json.dumps([{"source": m["source"]["name"], "relation": m["relation"]["relation"],
                        "target": m["target"]["name"], "depth": m["depth"]} for m in matches], ensure_ascii=False)
