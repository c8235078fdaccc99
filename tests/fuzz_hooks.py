"""Schemathesis hooks for tests/api/test_fuzz_api.py (loaded through SCHEMATHESIS_HOOKS).

JSON Schema cannot say "a TOML agent manifest with a name no other agent has" or "a provider
of the live catalog", so nearly every generated `POST /api/agents` and `POST /api/models/custom`
body is (rightly) refused, and the stateful phase would seldom get a resource to follow the
document's links from (agent -> detail, message, memory, workflow -> run -> run detail ...).
Most positive cases of those two operations therefore carry a minimal valid body with a fresh
name; the rest, and every negative case, stay as generated.
"""

from __future__ import annotations

import uuid

import schemathesis
from hypothesis import strategies as st


def _sometimes(case, make):  # type: ignore[no-untyped-def]
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return st.just(case)

    def pick(valid: bool):  # type: ignore[no-untyped-def]
        if valid:
            case.body = make()
        return case

    return st.sampled_from([True, True, True, False]).map(pick)


@schemathesis.hook("flatmap_case").apply_to(operation_id="agents.spawn")
def spawn_valid_agents(context, case):  # type: ignore[no-untyped-def]
    return _sometimes(case, lambda: {
        "manifest_toml": f'name = "fz-{uuid.uuid4().hex[:12]}"\nprofile = "minimal"\n'})


@schemathesis.hook("flatmap_case").apply_to(operation_id="catalog.add_custom")
def add_valid_models(context, case):  # type: ignore[no-untyped-def]
    return _sometimes(case, lambda: {
        "id": f"fz-model-{uuid.uuid4().hex[:10]}", "display_name": "fuzzed", "provider": "openai",
        "context_window": 8192, "max_output_tokens": 1024, "input_cost_per_m": 1.0,
        "output_cost_per_m": 2.0, "supports_tools": True, "supports_vision": False,
        "supports_streaming": True})
