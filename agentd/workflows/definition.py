"""Workflow definitions: validate a create/update request into normalised steps.

Everything that can be known before a run is checked here, so a bad workflow is
refused at create time (400, naming the step and the field) instead of failing
halfway through a run: agent references, enums, positive integers, the fields
each mode needs, template syntax and variables used before they are defined.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from agentd.errors import BadRequest
from agentd.jsonsafe import NUL_MESSAGE, holds_nul

MODES = ("sequential", "fan_out", "collect", "conditional", "loop")
ERROR_MODES = ("fail", "skip", "retry")

DEFAULT_TIMEOUT_SECS = 120
DEFAULT_MAX_RETRIES = 3
DEFAULT_LOOP_ITERATIONS = 5
DEFAULT_PROMPT = "{{input}}"

# Upper bounds keep one request from pinning the executor for days.
MAX_STEPS = 100
MAX_TIMEOUT_SECS = 3600
MAX_RETRIES = 10
MAX_LOOP_ITERATIONS = 100
MAX_PROMPT_BYTES = 64 * 1024
MAX_NAME_LENGTH = 200

STEP_FIELDS = {"name", "agent", "agent_name", "agent_id", "prompt", "mode", "timeout_secs",
               "error_mode", "max_retries", "output_var", "condition", "max_iterations", "until"}

# `{{ name }}`; anything else between braces is a malformed placeholder.
_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

AgentExists = Callable[[dict[str, str]], bool]


@dataclass
class WorkflowDef:
    """A validated workflow: name, description and normalised step dicts."""

    name: str
    description: str
    steps: list[dict[str, Any]]


class StepError(BadRequest):
    """A refusal that belongs to one step: `index` (0-based) and `field` let a form show it there."""

    def __init__(self, message: str, index: int, field: str) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


def _fail(index: int, step: dict[str, Any], field: str, problem: str) -> StepError:
    label = f"step {index + 1}"
    name = step.get("name")
    # A step without a name of its own is normalised to its label: do not say it twice.
    if isinstance(name, str) and name and name != label:
        label += f" ({name!r})"
    return StepError(f"invalid workflow: {label}: {field}: {problem}", index, field)


def template_names(template: str) -> list[str]:
    """The variable names a template uses, in order; BadRequest text for malformed ones."""
    names = []
    for match in _PLACEHOLDER.finditer(template):
        inner = match.group(1).strip()
        if not _IDENTIFIER.match(inner):
            raise ValueError(f"malformed placeholder {match.group(0)!r}: expected {{{{name}}}} "
                             "with a name of letters, digits and underscores")
        names.append(inner)
    # A stray `{{` (or `}}`) left after removing the well-formed placeholders is a typo
    # that would otherwise be sent to the model verbatim.
    rest = _PLACEHOLDER.sub("", template)
    if "{{" in rest or "}}" in rest:
        raise ValueError("unbalanced '{{' or '}}' in template")
    return names


def render(template: str, current: str, variables: dict[str, str]) -> str:
    """Expand `{{input}}` and `{{var}}` in one pass (values are never re-expanded)."""
    def sub(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        if name == "input":
            return current
        return variables.get(name, "")
    return _PLACEHOLDER.sub(sub, template)


def _positive_int(value: Any, index: int, step: dict[str, Any], field: str, upper: int) -> int:
    # bool is an int subclass; `true` is not a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(index, step, field, f"must be a positive integer, got {value!r}")
    if value < 1:
        raise _fail(index, step, field, f"must be a positive integer, got {value}")
    if value > upper:
        raise _fail(index, step, field, f"must be at most {upper}, got {value}")
    return value


def _string(value: Any, index: int, step: dict[str, Any], field: str, *, required: bool = False) -> str:
    if not isinstance(value, str):
        raise _fail(index, step, field, f"must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise _fail(index, step, field, "must not be empty")
    if holds_nul(value):
        raise _fail(index, step, field, NUL_MESSAGE)
    return value


def _agent_ref(raw: dict[str, Any], index: int, mode: str) -> dict[str, str] | None:
    """The step's agent reference as `{"id": ...}` or `{"name": ...}` (None for a bare collect)."""
    given = [k for k in ("agent", "agent_name", "agent_id") if raw.get(k) is not None]
    if not given:
        if mode == "collect":
            return None  # a collect without an agent just joins the fan-out outputs
        raise _fail(index, raw, "agent", "an agent reference is required: 'agent_name', "
                                         "'agent': {\"id\": ...} or 'agent': {\"name\": ...}")
    if len(given) > 1:
        raise _fail(index, raw, given[1], f"give only one agent reference (got {', '.join(given)})")
    key = given[0]
    value = raw[key]
    if key == "agent_name":
        return {"name": _string(value, index, raw, key, required=True)}
    if key == "agent_id":
        return {"id": _string(value, index, raw, key, required=True)}
    if not isinstance(value, dict) or len(value) != 1 or not ({"id", "name"} & set(value)):
        raise _fail(index, raw, "agent", "must be an object with exactly one of 'id' or 'name'")
    (ref_key, ref_value), = value.items()
    return {ref_key: _string(ref_value, index, raw, f"agent.{ref_key}", required=True)}


def _parse_step(raw: Any, index: int, agent_exists: AgentExists) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise StepError(f"invalid workflow: step {index + 1}: must be an object, got {type(raw).__name__}",
                        index, "step")
    unknown = sorted(set(raw) - STEP_FIELDS)
    if unknown:
        raise _fail(index, raw, unknown[0], f"unknown field (expected some of {', '.join(sorted(STEP_FIELDS))})")

    def opt(field: str) -> Any:
        # null means "not given", so a definition read back from GET can be posted again.
        return raw.get(field)

    name = opt("name")
    name = f"step {index + 1}" if name is None else _string(name, index, raw, "name", required=True)
    if len(name) > MAX_NAME_LENGTH:
        raise _fail(index, raw, "name", f"longer than {MAX_NAME_LENGTH} characters")
    mode = opt("mode") or "sequential"
    if mode not in MODES:
        raise _fail(index, raw, "mode", f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    error_mode = opt("error_mode") or "fail"
    if error_mode not in ERROR_MODES:
        raise _fail(index, raw, "error_mode",
                    f"unknown error_mode {error_mode!r}: expected one of {', '.join(ERROR_MODES)}")
    agent = _agent_ref(raw, index, mode)
    if agent is not None and not agent_exists(agent):
        key, value = next(iter(agent.items()))
        raise _fail(index, raw, "agent", f"no agent with {key} {value!r}")
    prompt = opt("prompt")
    prompt = DEFAULT_PROMPT if prompt is None else _string(prompt, index, raw, "prompt")
    if len(prompt.encode("utf-8")) > MAX_PROMPT_BYTES:
        raise _fail(index, raw, "prompt", "too large (max 64 KB)")
    timeout = opt("timeout_secs")
    timeout = DEFAULT_TIMEOUT_SECS if timeout is None else _positive_int(
        timeout, index, raw, "timeout_secs", MAX_TIMEOUT_SECS)
    step: dict[str, Any] = {"name": name, "agent": agent, "prompt": prompt, "mode": mode,
                            "timeout_secs": timeout, "error_mode": error_mode}

    retries = opt("max_retries")
    if error_mode == "retry":
        step["max_retries"] = DEFAULT_MAX_RETRIES if retries is None else _positive_int(
            retries, index, raw, "max_retries", MAX_RETRIES)
    elif retries is not None:
        raise _fail(index, raw, "max_retries", "only applies with error_mode 'retry'")

    output_var = opt("output_var")
    if output_var is not None:
        output_var = _string(output_var, index, raw, "output_var", required=True)
        if not _IDENTIFIER.match(output_var):
            raise _fail(index, raw, "output_var",
                        f"{output_var!r} is not a valid name (letters, digits, underscores)")
        if output_var == "input":
            raise _fail(index, raw, "output_var", "'input' is reserved for the previous step's output")
    step["output_var"] = output_var

    condition = opt("condition")
    if mode == "conditional":
        if condition is None:
            raise _fail(index, raw, "condition", "required for a conditional step")
        step["condition"] = _string(condition, index, raw, "condition", required=True)
    elif condition is not None:
        raise _fail(index, raw, "condition", "only applies to mode 'conditional'")

    max_iterations, until = opt("max_iterations"), opt("until")
    if mode == "loop":
        if max_iterations is None and until is None:
            raise _fail(index, raw, "until", "a loop step needs 'until' or 'max_iterations'")
        step["max_iterations"] = DEFAULT_LOOP_ITERATIONS if max_iterations is None else _positive_int(
            max_iterations, index, raw, "max_iterations", MAX_LOOP_ITERATIONS)
        # An empty `until` would match every output and stop after one pass; refuse it.
        step["until"] = None if until is None else _string(until, index, raw, "until", required=True)
    else:
        for field, value in (("max_iterations", max_iterations), ("until", until)):
            if value is not None:
                raise _fail(index, raw, field, "only applies to mode 'loop'")
    return step


def _check_flow(steps: list[dict[str, Any]]) -> None:
    """Template variables must be defined by an earlier step; collect needs fan-out before it."""
    defined: set[str] = set()
    group_vars: set[str] = set()   # output_vars of the fan-out group being built
    fanout_since_collect = False
    for index, step in enumerate(steps):
        in_group = step["mode"] == "fan_out" and index > 0 and steps[index - 1]["mode"] == "fan_out"
        if not in_group:
            defined |= group_vars
            group_vars = set()
        try:
            names = template_names(step["prompt"])
        except ValueError as exc:
            raise _fail(index, step, "prompt", str(exc)) from None
        for name in names:
            if name == "input" or name in defined:
                continue
            if name in group_vars:
                raise _fail(index, step, "prompt",
                            f"'{{{{{name}}}}}' is set by a fan_out step running in parallel with this one")
            raise _fail(index, step, "prompt",
                        f"'{{{{{name}}}}}' is used before any earlier step defines it (output_var)")
        if step["mode"] == "collect":
            if not fanout_since_collect:
                raise _fail(index, step, "mode", "a collect step needs at least one fan_out step "
                                                 "before it (since the previous collect)")
            fanout_since_collect = False
        elif step["mode"] == "fan_out":
            fanout_since_collect = True
        var = step["output_var"]
        if var is None:
            continue
        if step["mode"] == "fan_out":
            if var in group_vars:
                raise _fail(index, step, "output_var",
                            f"{var!r} is also set by a fan_out step running in parallel with this one")
            group_vars.add(var)
        else:
            defined.add(var)


def parse_workflow(body: Any, agent_exists: AgentExists) -> WorkflowDef:
    """Validate a POST/PUT /api/workflows body; BadRequest naming the step and field."""
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - {"name", "description", "steps"})
    if unknown:
        raise BadRequest(f"invalid workflow: unknown field {unknown[0]!r} "
                         "(expected name, description, steps)")
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadRequest("invalid workflow: name: a non-empty string is required")
    if len(name) > MAX_NAME_LENGTH:
        raise BadRequest(f"invalid workflow: name: longer than {MAX_NAME_LENGTH} characters")
    description = body.get("description")
    description = "" if description is None else description
    if not isinstance(description, str):
        raise BadRequest("invalid workflow: description: must be a string")
    for field, value in (("name", name), ("description", description)):
        if holds_nul(value):
            raise BadRequest(f"invalid workflow: {field}: {NUL_MESSAGE}")
    raw_steps = body.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise BadRequest("invalid workflow: steps: a non-empty array of steps is required")
    if len(raw_steps) > MAX_STEPS:
        raise BadRequest(f"invalid workflow: steps: at most {MAX_STEPS} steps")
    steps = [_parse_step(raw, i, agent_exists) for i, raw in enumerate(raw_steps)]
    _check_flow(steps)
    return WorkflowDef(name=name.strip(), description=description, steps=steps)
