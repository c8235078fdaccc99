"""The workflow form: steps as fields (one fieldset per step), or the whole definition as
JSON or TOML text, into the body POST /api/workflows takes; and back, to fill the form.

The engine validates what this builds (agentd/workflows/definition.py), so a refused
step comes back as a `StepError` whose index is mapped to the fieldset it came from.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable

from werkzeug.datastructures import MultiDict

from agentd import jsonsafe, tomlsafe
from agentd.errors import BadRequest

# Form fields of a step, in the order a fieldset shows them.
STEP_FIELDS = ("name", "agent_name", "prompt", "mode", "error_mode", "timeout_secs", "max_retries", "output_var",
               "condition", "max_iterations", "until")
INTEGER_FIELDS = ("timeout_secs", "max_retries", "max_iterations")
BLANK_ROWS = 2     # empty fieldsets offered after the existing steps (more after each save)
MAX_ROWS = 100


@dataclass
class WorkflowForm:
    """What the form shows: the values typed (or stored) and where an error belongs."""

    name: str = ""
    description: str = ""
    steps: list[dict[str, str]] = field(default_factory=list)
    definition: str = ""          # the advanced text, when that was used
    error: str = ""
    error_row: int | None = None  # the fieldset the error belongs to
    error_field: str = ""

    def rows(self) -> list[dict[str, str]]:
        """The step fieldsets: every step, then a few empty ones."""
        blank = dict.fromkeys(STEP_FIELDS, "")
        return [dict(blank, **s) for s in self.steps] + [dict(blank) for _ in range(BLANK_ROWS)]


def from_definition(workflow: dict[str, Any], name_of: Callable[[dict[str, str]], str | None]) -> WorkflowForm:
    """The form of a stored workflow (GET /api/workflows/{id}); `name_of(ref)` names the live
    agent a step refers to by id (the form's agent field takes names)."""
    steps = []
    for step in workflow["steps"]:
        row = {k: "" if step.get(k) is None else str(step[k]) for k in STEP_FIELDS if k != "agent_name"}
        agent = step.get("agent") or {}
        row["agent_name"] = agent.get("name") or (agent and name_of(agent)) or agent.get("id") or ""
        steps.append(row)
    body = {"name": workflow["name"], "description": workflow["description"],
            "steps": [_stored_step(s) for s in workflow["steps"]]}
    return WorkflowForm(name=workflow["name"], description=workflow["description"], steps=steps,
                        definition=json.dumps(body, indent=2, ensure_ascii=False))


def _stored_step(step: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if v is not None}


def read(form: MultiDict) -> WorkflowForm:
    """The form as typed (empty step fieldsets are left out)."""
    typed = WorkflowForm(name=form.get("name", ""), description=form.get("description", ""),
                         definition=form.get("definition", "") if form.get("use_definition") else "")
    rows = []
    for i in range(MAX_ROWS):
        if f"steps-{i}-name" not in form:
            break
        rows.append({k: form.get(f"steps-{i}-{k}", "") for k in STEP_FIELDS})
    typed.steps = [row for row in rows if any(row[k].strip() for k in ("name", "agent_name", "prompt"))]
    return typed


def body(typed: WorkflowForm) -> dict[str, Any] | Any:
    """The request body the typed form stands for: the definition text when one was given,
    else the fields (step i of the body is step fieldset i of `typed.steps`)."""
    if typed.definition.strip():
        return parse_text(typed.definition)
    return {"name": typed.name, "description": typed.description, "steps": [_step(row) for row in typed.steps]}


def _step(row: dict[str, str]) -> dict[str, Any]:
    step: dict[str, Any] = {}
    for key in STEP_FIELDS:
        value = row[key].strip() if key != "prompt" else row[key]
        if value == "" or (key in ("mode", "error_mode") and value == "default"):
            continue
        if key in INTEGER_FIELDS and value.isdigit():
            step[key] = int(value)
        else:
            # Anything else the engine refuses with a message naming the step and field.
            step[key] = value
    return step


def parse_text(text: str) -> Any:
    """A definition typed as JSON or TOML (`name`, `description`, `[[steps]]`)."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            return jsonsafe.loads(stripped)
        except ValueError as exc:
            raise BadRequest(f"the definition is not valid JSON: {exc}") from None
    try:
        return tomlsafe.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadRequest(f"the definition is not valid TOML: {exc}") from None
