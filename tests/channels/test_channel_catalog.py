"""The shape of agentd/data/channels.json, the hand-edited source of the channel catalogue:
every adapter carries the fields the API shows, and every config key a kind and a default
of that kind."""

from __future__ import annotations

import json

import pytest

from agentd.channels.catalog import DATA, ChannelCatalog

ENTRY = {"name": str, "display_name": str, "icon": str, "description": str, "category": str,
         "difficulty": str, "setup_time": str, "quick_setup": str, "setup_type": str,
         "fields": list, "setup_steps": list, "config_template": str, "protocol": str,
         "is_qr_adapter": bool, "inbound": str, "keys": dict}
FIELD = {"key": str, "label": str, "type": str, "env_var": (str, type(None)), "required": bool,
         "placeholder": (str, type(None)), "advanced": bool}
KIND_TYPES = {"text": str, "number": (int, float), "bool": bool, "list": list, "table": dict}
COMMON_KEYS = {"default_agent", "allowed_users", "allowed_channels"}

ITEMS = json.loads(DATA.read_text(encoding="utf-8"))


def test_catalogue_holds_the_spec_40_once_each():
    names = [item["name"] for item in ITEMS]
    assert len(names) == 40 and len(set(names)) == 40
    assert ChannelCatalog.load().names() == names
    counts: dict[str, int] = {}
    for item in ITEMS:
        counts[item["category"]] = counts.get(item["category"], 0) + 1
    assert counts == {"messaging": 12, "social": 5, "enterprise": 10, "developer": 9, "notifications": 4}


@pytest.mark.parametrize("item", ITEMS, ids=[item["name"] for item in ITEMS])
def test_adapter_entry_has_the_shape_the_api_shows(item):
    assert set(item) == set(ENTRY)
    for key, kind in ENTRY.items():
        assert isinstance(item[key], kind), key
    assert item["name"] and item["display_name"] and item["description"]
    assert item["difficulty"] in ("Easy", "Medium", "Hard")
    assert item["setup_type"] in ("form", "qr")
    assert item["is_qr_adapter"] == (item["setup_type"] == "qr")
    assert item["config_template"].startswith(f"[channels.{item['name']}]")
    assert item["setup_steps"] and all(isinstance(step, str) and step for step in item["setup_steps"])
    for field in item["fields"]:
        assert set(field) == set(FIELD), field
        for key, kind in FIELD.items():
            assert isinstance(field[key], kind), (field["key"], key)
        assert field["type"] in ("secret", "text", "number", "list")
        # A field the API shows is always a key its section accepts.
        assert field["key"] in item["keys"], field["key"]


@pytest.mark.parametrize("item", ITEMS, ids=[item["name"] for item in ITEMS])
def test_every_config_key_has_a_kind_and_a_default_of_that_kind(item):
    keys = item["keys"]
    assert COMMON_KEYS <= set(keys)
    for key, spec in keys.items():
        assert {"kind", "default"} <= set(spec) <= {"kind", "default", "agentd"}, key
        assert spec["kind"] in KIND_TYPES, key
        default = spec["default"]
        if default is not None:
            assert isinstance(default, KIND_TYPES[spec["kind"]]), key
            assert spec["kind"] == "bool" or not isinstance(default, bool), key
        if key.endswith("_env"):
            assert spec["kind"] == "text", key
