"""skill_list, skill_describe and skill_execute: an agent loads a skill's instructions on
demand instead of carrying every skill in its prompt.

Skills never run code here: `skill_execute` without `tool` returns the instructions (the
agent follows them with its own tools, under its own policies), and with `tool` it reads
that file of the skill (a script, a template, a reference), confined to the skill's folder.
"""

from __future__ import annotations

import json
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.errors import AgentdError


def _permitted(ctx: ToolContext) -> list[Any]:
    return list(ctx.skills or [])


def _find(ctx: ToolContext, name: str) -> Any:
    for skill in _permitted(ctx):
        if skill.name == name:
            return skill
    known = ", ".join(s.name for s in _permitted(ctx)) or "none"
    raise ToolError(f"no skill named '{name}' is available to this agent (available: {known})")


@tool("skill_list", "List the skills available to this agent: name, description and files.", {},
      read_only=True)
def skill_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps([{"name": s.name, "description": s.description, "files": list(s.files)}
                       for s in _permitted(ctx)])


@tool("skill_describe", "Read a skill's full instructions (its SKILL.md body) by name.",
      {"name": {"type": "string", "description": "The skill name (as returned by skill_list)"}},
      ("name",), read_only=True)
def skill_describe(ctx: ToolContext, args: dict[str, Any]) -> str:
    skill = _find(ctx, args["name"])
    files = "\n".join(f"- {f}" for f in skill.files if f != "SKILL.md")
    extra = f"\n\nFiles of this skill (read one with skill_execute and tool=<file>):\n{files}" if files else ""
    return f"# {skill.name}\n{skill.description}\n\n{skill.body}{extra}"


@tool("skill_execute", "Use an installed skill: without `tool`, returns its instructions to follow "
      "with your own tools; with `tool`, returns that file of the skill (read-only).",
      {"skill": {"type": "string", "description": "The skill name (as returned by skill_list)"},
       "tool": {"type": "string", "description": "Optional: a file of the skill, relative to its folder"},
       "input": {"type": "object", "description": "Optional JSON input, handed back with the instructions"}},
      ("skill",), read_only=True)
def skill_execute(ctx: ToolContext, args: dict[str, Any]) -> str:
    from agentd.skills import read_file

    skill = _find(ctx, args["skill"])
    if args.get("tool"):
        try:
            return read_file(skill, args["tool"])
        except AgentdError as exc:
            raise ToolError(exc.message) from None
    given = f"\n\nInput:\n{json.dumps(args['input'])}" if args.get("input") else ""
    return f"Follow the instructions of skill '{skill.name}':\n\n{skill.body}{given}"
