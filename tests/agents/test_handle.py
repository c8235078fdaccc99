"""The agent handle module (agentd/agents/handle.py): id parsing and the shared limits."""

from __future__ import annotations

import uuid

import pytest

from agentd.agents import handle
from agentd.errors import BadRequest


def test_parse_uuid_normalises() -> None:
    u = uuid.uuid4()
    for form in (str(u), str(u).upper(), u.hex, "{" + str(u) + "}", "urn:uuid:" + str(u)):
        assert handle.parse_uuid(form) == str(u)


@pytest.mark.parametrize("value", ["", "x", "3f2b8c1e-7d4a-4e9b-9c1a-2b5d6e7f8a9", "3f2b8c1e-7d4a-4e9b-9c1a-2b5d6e7f8a9b0",
                                   None, 12])
def test_parse_uuid_refuses_with_what_it_was(value) -> None:
    with pytest.raises(BadRequest) as err:
        handle.parse_uuid(value)
    assert err.value.message == f"invalid agent id: {value!r} is not a UUID"
    with pytest.raises(BadRequest) as err:
        handle.parse_uuid(value, "session")
    assert err.value.message == f"invalid session id: {value!r} is not a UUID"
    assert err.value.__suppress_context__


def test_limits_and_notes() -> None:
    assert handle.MODES == ("Auto", "Manual", "Observe")
    assert (handle.MESSAGE_LIMIT, handle.UPLOAD_LIMIT, handle.COMPACT_KEEP) == (65536, 10485760, 10)
    assert handle.UPLOAD_TYPES == ("image/", "text/", "audio/", "application/pdf")
    assert handle.STOPPED_NOTE == "[run stopped before the agent answered]"
    assert handle.CAPABILITY_TOOLS == {"shell": {"shell_exec"}, "network": {"web_fetch", "web_search"},
                                       "agent_spawn": {"agent_spawn"}}


def test_run_options_defaults() -> None:
    from agentd.llm.types import GenerationParams

    o = handle.RunOptions()
    assert (o.max_tokens, o.temperature, o.extra_system, o.images, o.params) == (None, None, "", [], GenerationParams())
    assert handle.RunOptions().images is not o.images
