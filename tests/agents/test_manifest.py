"""Agent manifests parsed in process: every default, every error text, unknown-key warnings.

POST /api/agents reaches the same `parse_manifest` (tests/agents/test_agents.py checks the daemon's
answers); here the exact values and near misses are checked without a daemon.
"""

from __future__ import annotations

import pytest

from agentd.agents.manifest import (MANIFEST_LIMIT, PROFILES, Manifest, ManifestError, parse_manifest,
                                    profile_list)
from agentd.errors import BadRequest, PayloadTooLarge

DEFAULTS = {
    "name": "x", "description": "", "version": "0.1.0", "author": "", "profile": None,
    "tags": [], "skills": [], "mcp_servers": [], "max_history_messages": None,
    "model": {"provider": "default", "model": "default", "system_prompt": "You are a helpful AI agent.",
              "max_tokens": 4096, "temperature": 0.7, "api_key_env": "", "base_url": ""},
    "fallback_models": [],
    "capabilities": {"tools": [], "network": [], "memory_read": [], "memory_write": [], "shell": [],
                     "agent_message": [], "agent_spawn": False, "max_llm_tokens_per_hour": 0},
    "resources": {"max_llm_tokens_per_hour": 0, "max_iterations": None, "tool_timeout_secs": 120.0},
    "autonomous": {"max_iterations": 50},
    "identity": {"emoji": "🤖", "avatar_url": None, "color": "#3fb950"},
    "schedule": {"kind": "reactive"},
}


def error_of(text: str) -> str:
    with pytest.raises(ManifestError) as info:
        parse_manifest(text)
    return info.value.message


def test_minimal_manifest_gets_every_default() -> None:
    m = parse_manifest('name = "x"\n')
    assert m.data == DEFAULTS, "BUG: a default of the manifest schema changed"
    assert m.toml_text == 'name = "x"\n' and m.warnings == [] and m.extra == {}
    assert (m.name, m.profile, m.model, m.capabilities) == ("x", None, DEFAULTS["model"], DEFAULTS["capabilities"])
    assert m.max_iterations == 50 and m.tokens_per_hour == 0 and m.history_messages == 20
    assert m.tool_timeout == 120.0 and isinstance(m.tool_timeout, float)


def test_history_window_0_means_20_and_the_limits_are_allowed() -> None:
    for text, window in (("max_history_messages = 0", 20), ("max_history_messages = 1", 1),
                         ("max_history_messages = 100000", 100_000), ("", 20)):
        assert parse_manifest(f'name = "x"\n{text}\n').history_messages == window, text


def test_manifest_error_is_a_400_with_the_prefix() -> None:
    exc = ManifestError("detail here")
    assert isinstance(exc, BadRequest) and exc.status == 400
    assert exc.message == "invalid manifest format: detail here"


def test_limits_and_iterations_come_from_either_table() -> None:
    m = parse_manifest('name = "x"\n[resources]\nmax_iterations = 7\nmax_llm_tokens_per_hour = 900\n'
                       'tool_timeout_secs = 3\n[autonomous]\nmax_iterations = 9\n')
    assert m.max_iterations == 7, "BUG: [resources].max_iterations must win over [autonomous]"
    assert m.tokens_per_hour == 900 and m.tool_timeout == 3.0
    m = parse_manifest('name = "x"\n[autonomous]\nmax_iterations = 9\n[capabilities]\nmax_llm_tokens_per_hour = 5\n'
                       '[resources]\nmax_llm_tokens_per_hour = 900\n')
    assert m.max_iterations == 9 and m.tokens_per_hour == 5, "BUG: [capabilities] token limit must win"


def test_profile_is_lower_cased_and_model_name_is_an_alias() -> None:
    m = parse_manifest('name = "x"\nprofile = "CoDing"\n[model]\nname = "gpt-x"\n')
    assert m.profile == "coding" and m.data["profile"] == "coding"
    assert m.model["model"] == "gpt-x" and m.warnings == [], "BUG: [model].name is an accepted alias"
    m = parse_manifest('name = "x"\nprofile = "custom"\n[model]\nname = "a"\nmodel = "b"\n')
    assert m.profile == "custom" and m.model["model"] == "b"
    assert m.warnings == [], "BUG: `name` next to `model` in [model] is still a known key"


def test_one_bare_string_is_a_one_item_list_of_tags_but_no_grant() -> None:
    m = parse_manifest('name = "x"\ntags = "solo"\n[capabilities]\ntools = ["file_read"]\nshell = ["ls", "cat"]\n')
    assert m.data["tags"] == ["solo"] and m.capabilities["tools"] == ["file_read"]
    assert m.capabilities["shell"] == ["ls", "cat"]
    for key, value in (("network", '"none"'), ("shell", '"false"'), ("tools", '"file_read"'),
                       ("memory_write", '"self.*"'), ("memory_read", '"*"'), ("agent_message", '"a"')):
        assert error_of(f'name = "x"\n[capabilities]\n{key} = {value}\n') == \
            f"invalid manifest format: capabilities.{key}: Not a valid list.", key
    # An agent stored before grants had to be arrays still loads, as it was accepted.
    old = parse_manifest('name = "x"\n[capabilities]\ntools = "file_read"\n', new=False)
    assert old.capabilities["tools"] == ["file_read"]


@pytest.mark.parametrize("text, message", [
    ('name = 5\n', "name: Not a valid string."),
    ('description = "no name"\n', "name: Missing data for required field."),
    ('name = ""\n', "name: must be 1-64 ASCII letters, digits, spaces, '_', '.' or '-', starting with a letter or digit"),
    ('name = "-x"\n', "name: must be 1-64 ASCII letters, digits, spaces, '_', '.' or '-', starting with a letter or digit"),
    ('name = "x"\nprofile = "wizard"\n',
     "profile: unknown profile 'wizard'; one of automation, coding, custom, full, messaging, minimal, research"),
    ('name = "x"\n[model]\nmax_tokens = "lots"\ntemperature = 3\n',
     "model.max_tokens: Not a valid integer.; "
     "model.temperature: Must be greater than or equal to 0.0 and less than or equal to 2.0."),
    ('name = "x"\nfallback_models = [{provider = "a"}]\n',
     "fallback_models.0.model: Missing data for required field."),
    ('name = "x"\ntags = [1, "ok", 2]\n', "tags.0: Not a valid string.; tags.2: Not a valid string."),
    ('name = "x"\nmodel = 5\n', "model._schema: Invalid input type."),
    ('name = "x"\nfallback_models = "x"\n', "fallback_models: Not a valid list."),
    ('name = "x"\n[identity]\ncolor = "red"\n', "identity.color: String does not match expected pattern."),
    ('name = "x"\nmax_history_messages = -1\n',
     "max_history_messages: Must be greater than or equal to 0 and less than or equal to 100000."),
    ('name = "x"\nmax_history_messages = 100001\n',
     "max_history_messages: Must be greater than or equal to 0 and less than or equal to 100000."),
    ('name = "x"\nmax_history_messages = "20"\n', "max_history_messages: Not a valid integer."),
    ('name = "x"\n[resources]\nmax_iterations = 0\n',
     "resources.max_iterations: Must be greater than or equal to 1 and less than or equal to 1000."),
])
def test_error_messages_name_the_key(text: str, message: str) -> None:
    assert error_of(text) == f"invalid manifest format: {message}"


def test_toml_syntax_error() -> None:
    assert error_of('name = "x"\n[model\n') == ("invalid manifest format: TOML syntax error: "
                                                "Expected ']' at the end of a table declaration (at line 2, column 7)")


def test_size_limit_counts_utf8_bytes_at_and_past_the_limit() -> None:
    head = 'name = "big"\ndescription = "'
    fill = MANIFEST_LIMIT - len(head) - 2   # the closing quote and newline
    at_limit = head + "x" * fill + '"\n'
    assert len(at_limit.encode()) == MANIFEST_LIMIT == 1024 * 1024
    assert parse_manifest(at_limit).name == "big", "BUG: a manifest of exactly 1 MB is allowed"
    past = head + "x" * (fill + 1) + '"\n'
    assert too_large(past) == (413, "manifest too large (max 1 MB)")
    # é is two bytes: fewer characters than the limit, more bytes.
    wide = head + "é" * (fill // 2 + 1) + '"\n'
    assert len(wide) < MANIFEST_LIMIT < len(wide.encode("utf-8"))
    assert too_large(wide) == (413, "manifest too large (max 1 MB)"), "BUG: the limit is in bytes"


def too_large(text: str) -> tuple[int, str]:
    with pytest.raises(PayloadTooLarge) as info:
        parse_manifest(text)
    return info.value.status, info.value.message


def test_unknown_keys_are_warnings_with_suggestions() -> None:
    m = parse_manifest('name = "x"\nprofle = "a"\nzzz = 1\n[model]\nnaem = "m"\nfoo = 1\n'
                       '[capabilities]\ntols = []\n[identity]\ncolour = "x"\n')
    assert m.warnings == [
        "unknown key 'profle' ignored (did you mean 'profile'?)",
        "unknown key 'zzz' ignored",
        "unknown key 'model.naem' ignored (did you mean 'model.name'?)",
        "unknown key 'model.foo' ignored",
        "unknown key 'capabilities.tols' ignored (did you mean 'capabilities.tools'?)",
        "unknown key 'identity.colour' ignored (did you mean 'identity.color'?)",
    ]
    assert "profle" not in m.data and "naem" not in m.data["model"]


def test_suggestion_cutoff_is_three_quarters() -> None:
    # "too" vs "tools": 2*3/8 = 0.75, exactly the cutoff -> suggested; "toabs" vs "tools": 6/10
    # (difflib's default cutoff 0.6) and "to": 4/7 -> no suggestion.
    m = parse_manifest('name = "x"\n[capabilities]\ntoo = 1\ntoabs = 1\nto = 1\n')
    assert m.warnings == ["unknown key 'capabilities.too' ignored (did you mean 'capabilities.tools'?)",
                          "unknown key 'capabilities.toabs' ignored",
                          "unknown key 'capabilities.to' ignored"]


def test_unknown_keys_inside_a_list_of_tables() -> None:
    m = parse_manifest('name = "x"\nauthr = "me"\n[[fallback_models]]\nprovider = "a"\nmodel = "b"\nzz = 0\n'
                       '[[fallback_models]]\nprovider = "c"\nmodel = "d"\nmodle = "e"\nbase_url = "u"\n')
    assert m.warnings == ["unknown key 'authr' ignored (did you mean 'author'?)",
                          "unknown key 'fallback_models[0].zz' ignored",
                          "unknown key 'fallback_models[1].modle' ignored (did you mean 'fallback_models[1].model'?)"]
    assert m.data["fallback_models"] == [
        {"provider": "a", "model": "b", "api_key_env": "", "base_url": ""},
        {"provider": "c", "model": "d", "api_key_env": "", "base_url": "u"}]
    assert parse_manifest('name = "x"\ntags = ["a", "b"]\n').warnings == []


def test_manifest_dataclass_defaults_are_not_shared() -> None:
    a, b = Manifest(data={}), Manifest(data={})
    a.warnings.append("w")
    a.extra["k"] = 1
    assert b.warnings == [] and b.extra == {} and b.toml_text == ""


def test_profile_list_is_the_profiles_table_and_a_copy() -> None:
    listed = profile_list()
    assert listed == [{"name": name, "tools": tools} for name, tools in PROFILES.items()]
    assert [p["name"] for p in listed] == ["minimal", "coding", "research", "messaging", "automation", "full"]
    assert listed[0]["tools"] == ["file_read", "file_list"] and listed[-1]["tools"] == ["*"]
    listed[0]["tools"].append("shell_exec")
    assert PROFILES["minimal"] == ["file_read", "file_list"], "BUG: the profile list hands out the table itself"
