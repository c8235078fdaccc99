"""Workflow definitions: each refusal's exact message, every limit at and past its value, and
the normalised steps a valid definition becomes (the API returns them)."""

from __future__ import annotations

from typing import Any

import pytest

from agentd.errors import BadRequest
from agentd.workflows.definition import (MAX_LOOP_ITERATIONS, MAX_NAME_LENGTH, MAX_PROMPT_BYTES, MAX_RETRIES,
                                         MAX_STEPS, MAX_TIMEOUT_SECS, parse_workflow, render, template_names)

AGENTS = {("name", "writer"), ("id", "a-1")}


def exists(ref: dict[str, str]) -> bool:
    return next(iter(ref.items())) in AGENTS


def parse(steps: list[Any], **body: Any):
    return parse_workflow({"name": "wf", "steps": steps, **body}, exists)


def refusal(steps: list[Any] | None = None, body: Any = None) -> str:
    with pytest.raises(BadRequest) as caught:
        parse_workflow(body if body is not None else {"name": "wf", "steps": steps}, exists)
    return str(caught.value)


S = {"agent_name": "writer"}


def test_defaults_of_a_minimal_step() -> None:
    wf = parse([S], description=None)
    assert (wf.name, wf.description) == ("wf", "")
    assert wf.steps == [{"name": "step 1", "agent": {"name": "writer"}, "prompt": "{{input}}", "mode": "sequential",
                         "timeout_secs": 120, "error_mode": "fail", "output_var": None}]


def test_every_field_normalised() -> None:
    steps = [{"name": "a", "agent": {"id": "a-1"}, "prompt": "p {{input}}", "mode": "fan_out", "timeout_secs": 5,
              "error_mode": "retry", "output_var": "x"},
             {"agent_id": "a-1", "mode": "fan_out", "error_mode": "retry", "max_retries": 2, "output_var": "y"},
             {"mode": "collect", "output_var": "z"},
             {"agent_name": "writer", "mode": "conditional", "condition": "yes", "prompt": "{{x}} {{ y }} {{z}}"},
             {"agent_name": "writer", "mode": "loop", "until": "DONE"},
             {"agent_name": "writer", "mode": "loop", "max_iterations": 7, "error_mode": "skip"}]
    wf = parse(steps, name="  spaced  ", description="d")
    assert (wf.name, wf.description) == ("spaced", "d")
    assert wf.steps[0] == {"name": "a", "agent": {"id": "a-1"}, "prompt": "p {{input}}", "mode": "fan_out",
                           "timeout_secs": 5, "error_mode": "retry", "max_retries": 3, "output_var": "x"}
    assert wf.steps[1]["max_retries"] == 2 and wf.steps[1]["agent"] == {"id": "a-1"}
    assert wf.steps[2]["agent"] is None
    assert wf.steps[3]["condition"] == "yes"
    assert (wf.steps[4]["max_iterations"], wf.steps[4]["until"]) == (5, "DONE")
    assert (wf.steps[5]["max_iterations"], wf.steps[5]["until"]) == (7, None)


P = "invalid workflow: step 1: "
CASES = [
    ({**S, "bogus": 1}, P + "bogus: unknown field (expected some of agent, agent_id, agent_name, condition, "
                           "error_mode, max_iterations, max_retries, mode, name, output_var, prompt, timeout_secs, until)"),
    ({**S, "name": ""}, P + "name: must not be empty"),
    ({**S, "name": 5}, P + "name: must be a string, got int"),
    ({**S, "name": "n" * (MAX_NAME_LENGTH + 1)}, "invalid workflow: step 1 ('" + "n" * 201 + "'): name: longer than 200 characters"),
    ({**S, "mode": "parallel"}, P + "mode: unknown mode 'parallel': expected one of sequential, fan_out, collect, conditional, loop"),
    ({**S, "error_mode": "ignore"}, P + "error_mode: unknown error_mode 'ignore': expected one of fail, skip, retry"),
    ({}, P + "agent: an agent reference is required: 'agent_name', 'agent': {\"id\": ...} or 'agent': {\"name\": ...}"),
    ({"agent_name": "writer", "agent_id": "a-1"}, P + "agent_id: give only one agent reference (got agent_name, agent_id)"),
    ({"agent": {"id": "a-1", "name": "writer"}}, P + "agent: must be an object with exactly one of 'id' or 'name'"),
    ({"agent": {"nick": "w"}}, P + "agent: must be an object with exactly one of 'id' or 'name'"),
    ({"agent": "writer"}, P + "agent: must be an object with exactly one of 'id' or 'name'"),
    ({"agent": {"name": " "}}, P + "agent.name: must not be empty"),
    ({"agent_id": ""}, P + "agent_id: must not be empty"),
    ({"agent_name": "ghost"}, P + "agent: no agent with name 'ghost'"),
    ({"agent_id": "a-9"}, P + "agent: no agent with id 'a-9'"),
    ({**S, "prompt": 3}, P + "prompt: must be a string, got int"),
    ({**S, "prompt": "é" * (MAX_PROMPT_BYTES // 2 + 1)}, P + "prompt: too large (max 64 KB)"),
    ({**S, "timeout_secs": 0}, P + "timeout_secs: must be a positive integer, got 0"),
    ({**S, "timeout_secs": True}, P + "timeout_secs: must be a positive integer, got True"),
    ({**S, "timeout_secs": 1.5}, P + "timeout_secs: must be a positive integer, got 1.5"),
    ({**S, "timeout_secs": MAX_TIMEOUT_SECS + 1}, P + "timeout_secs: must be at most 3600, got 3601"),
    ({**S, "max_retries": 2}, P + "max_retries: only applies with error_mode 'retry'"),
    ({**S, "error_mode": "retry", "max_retries": MAX_RETRIES + 1}, P + "max_retries: must be at most 10, got 11"),
    ({**S, "output_var": "1x"}, P + "output_var: '1x' is not a valid name (letters, digits, underscores)"),
    ({**S, "output_var": "input"}, P + "output_var: 'input' is reserved for the previous step's output"),
    ({**S, "output_var": ""}, P + "output_var: must not be empty"),
    ({**S, "mode": "conditional"}, P + "condition: required for a conditional step"),
    ({**S, "mode": "conditional", "condition": ""}, P + "condition: must not be empty"),
    ({**S, "condition": "x"}, P + "condition: only applies to mode 'conditional'"),
    ({**S, "mode": "loop"}, P + "until: a loop step needs 'until' or 'max_iterations'"),
    ({**S, "mode": "loop", "until": ""}, P + "until: must not be empty"),
    ({**S, "mode": "loop", "max_iterations": MAX_LOOP_ITERATIONS + 1}, P + "max_iterations: must be at most 100, got 101"),
    ({**S, "max_iterations": 3}, P + "max_iterations: only applies to mode 'loop'"),
    ({**S, "until": "x"}, P + "until: only applies to mode 'loop'"),
    ({**S, "name": "named", "prompt": "{{ 1bad }}"},
     "invalid workflow: step 1 ('named'): prompt: malformed placeholder '{{ 1bad }}': expected {{name}} with a name "
     "of letters, digits and underscores"),
    ({**S, "prompt": "{{input} }"}, P + "prompt: unbalanced '{{' or '}}' in template"),
    ({**S, "prompt": "{{later}}"}, P + "prompt: '{{later}}' is used before any earlier step defines it (output_var)"),
    ({"mode": "collect"}, P + "mode: a collect step needs at least one fan_out step before it (since the previous collect)"),
    ("text", "invalid workflow: step 1: must be an object, got str"),
]


@pytest.mark.parametrize("step,message", CASES)
def test_step_refusals_name_the_step_and_field(step, message) -> None:
    assert refusal([step]) == message


@pytest.mark.parametrize("step", [{**S, "timeout_secs": MAX_TIMEOUT_SECS}, {**S, "timeout_secs": 1},
                                  {**S, "error_mode": "retry", "max_retries": MAX_RETRIES},
                                  {**S, "error_mode": "retry", "max_retries": 1},
                                  {**S, "mode": "loop", "max_iterations": MAX_LOOP_ITERATIONS},
                                  {**S, "mode": "loop", "max_iterations": 1},
                                  {**S, "name": "n" * MAX_NAME_LENGTH},
                                  {**S, "prompt": "é" * (MAX_PROMPT_BYTES // 2)}])
def test_values_exactly_at_each_limit_are_accepted(step) -> None:
    parse([step])


def test_body_level_refusals() -> None:
    assert refusal(body=[1]) == "request body must be a JSON object, got list"
    assert refusal(body={"name": "w", "steps": [S], "tags": []}) == \
        "invalid workflow: unknown field 'tags' (expected name, description, steps)"
    for name in (None, "", "  ", 3):
        assert refusal(body={"name": name, "steps": [S]}) == "invalid workflow: name: a non-empty string is required"
    assert refusal(body={"name": "x" * 201, "steps": [S]}) == "invalid workflow: name: longer than 200 characters"
    parse_workflow({"name": "x" * 200, "steps": [S]}, exists)
    assert refusal(body={"name": "w", "steps": [S], "description": 1}) == "invalid workflow: description: must be a string"
    for steps in (None, [], {}):
        assert refusal(body={"name": "w", "steps": steps}) == \
            "invalid workflow: steps: a non-empty array of steps is required"
    assert refusal([S] * (MAX_STEPS + 1)) == "invalid workflow: steps: at most 100 steps"
    assert len(parse([S] * MAX_STEPS).steps) == MAX_STEPS


def test_flow_rules_across_steps() -> None:
    fan = {**S, "mode": "fan_out"}
    assert refusal([{**fan, "output_var": "a"}, {**fan, "prompt": "{{a}}"}]) == \
        "invalid workflow: step 2: prompt: '{{a}}' is set by a fan_out step running in parallel with this one"
    assert refusal([{**fan, "output_var": "a"}, {**fan, "output_var": "a"}]) == \
        "invalid workflow: step 2: output_var: 'a' is also set by a fan_out step running in parallel with this one"
    assert refusal([fan, {"mode": "collect"}, {"mode": "collect"}]) == (
        "invalid workflow: step 3: mode: a collect step needs at least one fan_out step before it "
        "(since the previous collect)")
    # A fan-out group's variables are usable once the group has ended; sequential ones right away.
    parse([{**fan, "output_var": "a"}, {**fan, "output_var": "b"}, {"mode": "collect"}, {**S, "prompt": "{{a}}{{b}}"}])
    parse([{**S, "output_var": "a"}, {**S, "prompt": "{{a}}", "output_var": "b"}, {**fan, "prompt": "{{b}}"},
           {"mode": "collect"}])
    parse([{**fan, "output_var": "a"}, {**S, "prompt": "{{a}}"}])
    parse([{**S, "output_var": "a"}, {**fan, "prompt": "{{a}}"}, {**fan, "prompt": "{{a}}"}])


def test_templates() -> None:
    assert template_names("{{a}} x {{ b_2 }} {{input}}") == ["a", "b_2", "input"]
    assert template_names("no placeholders } {") == []
    with pytest.raises(ValueError, match="unbalanced"):
        template_names("}} stray")
    assert render("{{input}}/{{ a }}/{{missing}}", "IN", {"a": "{{input}}"}) == "IN/{{input}}/", \
        "BUG: values are re-expanded or unknown names kept"
