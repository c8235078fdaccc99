"""A scoped key's agent list over the channels (agentd/api/channel_reach.py), through the
daemon's own app in process: which channels a key limited to some agents lists with their
agent and start error, and which it may configure, remove and test (by the agent a channel
answers as: its `default_agent`, its thread routes, else the daemon's first agent)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from flask.testing import FlaskClient

from agentd.api import create_app
from agentd.config import parse_config
from agentd.kernel import Kernel
from support import with_test_db

ADMIN = "reach-admin"
# A variable nobody sets: the adapter cannot start, so the channel carries a start error.
TOKEN_ENV = "TELEGRAM_REACH_TEST_TOKEN"
START_ERROR = f"environment variable {TOKEN_ENV} is not set"
ABSENT = {"error": "agent not found"}


class Site:
    """A kernel with two agents (the first spawned outside the key's list) and its app."""

    def __init__(self, home: Path) -> None:
        data = {"api_key": ADMIN, "api": {"rate_limit_per_second": 100000, "rate_limit_burst": 100000}}
        self.kernel = Kernel.open(parse_config(with_test_db(data, home), home))
        self.client: FlaskClient = create_app(self.kernel).test_client()
        self.outside = self.kernel.agents.spawn('name = "desk-b-1"\n')
        self.inside = self.kernel.agents.spawn('name = "desk-a-1"\n')
        self.wide = self.kernel.keys.create({"name": "every-agent", "scopes": ["read", "manage"]})
        self.new_key()

    def new_key(self) -> None:
        """A key limited to the desk-a agents, its refusals audited under its own name."""
        self.key = self.kernel.keys.create({"name": f"desk-a-{uuid.uuid4().hex[:8]}", "scopes": ["read", "manage"],
                                            "agents": ["desk-a-*"]})

    def call(self, method: str, path: str, token: str = ADMIN, **kwargs: Any) -> tuple[int, Any]:
        r = self.client.open(path, method=method, headers={"Authorization": f"Bearer {token}"}, **kwargs)
        return r.status_code, r.get_json()

    def as_key(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        return self.call(method, path, self.key["key"], **kwargs)

    def configure(self, **section: Any) -> None:
        status, body = self.call("POST", "/api/channels/telegram/configure",
                                 json={"bot_token_env": TOKEN_ENV, **section})
        assert status == 200 and body["activated"] is False, body

    def listed(self, token: str = ADMIN) -> dict[str, Any]:
        """The telegram item of the channel list as `token` sees it: its default_agent and start error."""
        status, items = self.call("GET", "/api/channels", token)
        assert status == 200
        item = next(i for i in items if i["name"] == "telegram")
        field = next(f for f in item["fields"] if f["key"] == "default_agent")
        return {"configured": item["configured"], "value": field.get("value"), "has_value": field["has_value"],
                "error": item.get("error")}

    def refusals(self) -> list[dict[str, Any]]:
        return [e["detail"] for e in self.kernel.audit.recent(100, "key.refused", self.key["name"], None, None)]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    s = Site(tmp_path_factory.mktemp("channel-reach"))
    yield s
    s.kernel.close()


@pytest.fixture
def site(shared: Site) -> Iterator[Site]:
    """The shared site with a fresh key; the channel's configuration removed afterwards."""
    shared.new_key()
    yield shared
    shared.call("DELETE", "/api/channels/telegram/configure")


def test_a_key_sees_neither_the_name_nor_the_start_error_of_a_channel_of_another_agent(site: Site) -> None:
    site.configure(default_agent="desk-b-1")
    whole = {"configured": True, "value": "desk-b-1", "has_value": True, "error": START_ERROR}
    assert site.listed() == whole and site.listed(site.wide["key"]) == whole
    assert site.listed(site.key["key"]) == {"configured": True, "value": "", "has_value": False, "error": None}
    # Looking is no refused request: nothing is audited.
    assert site.refusals() == []


@pytest.mark.parametrize("ref", ["desk-a-1", "id"])
def test_a_key_sees_the_agent_and_start_error_of_its_own_agents_channel(site: Site, ref: str) -> None:
    ref = site.inside.id if ref == "id" else ref
    site.configure(default_agent=ref)
    assert site.listed(site.key["key"]) == {"configured": True, "value": ref, "has_value": True, "error": START_ERROR}


def test_a_channel_naming_an_agent_that_is_gone_keeps_its_error_but_not_the_name(site: Site) -> None:
    site.configure(default_agent="desk-gone")
    assert site.listed(site.key["key"]) == {"configured": True, "value": "", "has_value": False, "error": START_ERROR}


def test_a_key_may_not_remove_test_or_reconfigure_a_channel_of_another_agent(site: Site) -> None:
    site.configure(default_agent="desk-b-1")
    for method, path, body in [("DELETE", "/api/channels/telegram/configure", None),
                               ("POST", "/api/channels/telegram/test", {"message": "hi"}),
                               ("POST", "/api/channels/telegram/configure", {"default_agent": "desk-a-1"})]:
        assert site.as_key(method, path, json=body) == (404, ABSENT), (method, path)
    assert site.refusals() == [{"key_id": site.key["id"], "reason": "agent", "agent_id": site.outside.id}] * 3
    assert site.listed()["value"] == "desk-b-1"  # nothing changed
    assert site.call("DELETE", "/api/channels/telegram/configure", site.wide["key"]) == (
        200, {"status": "removed", "channel": "telegram"})


def test_a_key_may_not_name_another_agent_in_a_configuration(site: Site) -> None:
    path = "/api/channels/telegram/configure"
    for body in ({"default_agent": "desk-b-1"}, {"default_agent": site.outside.id},
                 {"default_agent": "desk-a-1", "thread_routes": {"7": "desk-a-1", "9": "desk-b-1"}}):
        assert site.as_key("POST", path, json={"bot_token_env": TOKEN_ENV, **body}) == (404, ABSENT), body
    assert site.listed() == {"configured": False, "value": None, "has_value": False, "error": None}
    status, body = site.as_key("POST", path, json={"bot_token_env": TOKEN_ENV, "default_agent": "desk-a-1",
                                                   "thread_routes": {"7": "desk-a-1"}})
    assert (status, body["status"], body["channel"]) == (200, "configured", "telegram"), body


def test_a_key_must_name_one_of_its_agents_as_the_default(site: Site) -> None:
    status, body = site.as_key("POST", "/api/channels/telegram/configure", json={"bot_token_env": TOKEN_ENV})
    assert (status, body) == (400, {"error": "default_agent: a key limited to some agents must name one of its agents"})
    status, body = site.call("POST", "/api/channels/telegram/configure", site.wide["key"],
                             json={"bot_token_env": TOKEN_ENV})
    assert (status, body["status"]) == (200, "configured")


def test_a_channel_without_a_default_answers_as_the_first_agent(site: Site) -> None:
    site.configure()  # the fallback: desk-b-1, spawned first, outside the key's list
    assert site.listed(site.key["key"])["error"] is None
    assert site.as_key("DELETE", "/api/channels/telegram/configure") == (404, ABSENT)
    site.kernel.agents.kill(site.outside)  # now the key's own agent is the first
    try:
        assert site.listed(site.key["key"])["error"] == START_ERROR
        assert site.as_key("DELETE", "/api/channels/telegram/configure") == (
            200, {"status": "removed", "channel": "telegram"})
    finally:
        site.outside = site.kernel.agents.spawn('name = "desk-b-1"\n')


def test_with_no_agent_at_all_a_key_may_remove_a_channel_without_a_default(tmp_path: Path) -> None:
    s = Site(tmp_path)
    try:
        s.configure()
        for handle in (s.outside, s.inside):
            s.kernel.agents.kill(handle)
        assert s.as_key("DELETE", "/api/channels/telegram/configure") == (
            200, {"status": "removed", "channel": "telegram"})
    finally:
        s.kernel.close()


def test_an_unknown_channel_is_404_for_everyone(site: Site) -> None:
    for token in (ADMIN, site.key["key"]):
        for method in ("POST", "DELETE"):
            assert site.call(method, "/api/channels/nosuch/configure", token, json={} if method == "POST" else None) \
                == (404, {"error": "unknown channel 'nosuch'"}), (token, method)
