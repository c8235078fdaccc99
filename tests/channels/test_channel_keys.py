"""A channel a scoped API key configured answers as the key, through the real daemon and the
ntfy fake: each message's run is the key's (its usage rows name it, so its spend counts
them), and once the key is disabled, deleted or no longer reaches the agent the sender is
told why instead of getting an answer. The admin configuring it again makes it the admin's."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
import requests

from channel_fixtures import AGENT_TOML, CHANNEL_ENV, audit, wait_for
from conftest import LLM_ENV, llm_config
from fakes.ntfy import FakeNtfy
from support import Daemon, make_home, stop_shared

ADMIN = "admin-secret-for-channel-keys"
TOPIC = "keyed"


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory, fake_llm) -> Iterator[Daemon]:
    home = make_home(tmp_path_factory.mktemp("channel-keys"), f'api_key = "{ADMIN}"\n' + llm_config(fake_llm))
    daemon = Daemon(home, api_key=ADMIN, env_extra={**LLM_ENV, **CHANNEL_ENV}).start()
    created = daemon.post("/api/agents", json={"manifest_toml": AGENT_TOML})
    assert created.status_code == 201, created.text
    yield daemon
    stop_shared(daemon)


@pytest.fixture
def ntfy(d: Daemon) -> Iterator[FakeNtfy]:
    fake = FakeNtfy(CHANNEL_ENV["NTFY_TOKEN"]).start()
    yield fake
    d.delete("/api/channels/ntfy/configure")
    fake.stop()


def as_key(d: Daemon, key: dict[str, Any], method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, d.url + path, headers={"Authorization": f"Bearer {key['key']}"},
                            timeout=30, **kwargs)


def configure(d: Daemon, ntfy: FakeNtfy, key: dict[str, Any] | None) -> None:
    ntfy.subscriptions.clear()
    body = {"topic": TOPIC, "server_url": ntfy.url, "token_env": "NTFY_TOKEN", "default_agent": "helper"}
    r = as_key(d, key, "POST", "/api/channels/ntfy/configure", json=body) if key else \
        d.post("/api/channels/ntfy/configure", json=body)
    assert r.status_code == 200, r.text
    wait_for(lambda: ntfy.subscriptions, what="the channel's subscription")


def ask(ntfy: FakeNtfy, text: str) -> str:
    """Publish `text` on the topic; the channel's reply to it."""
    count = len(ntfy.bot_messages(TOPIC))
    ntfy.publish(TOPIC, text)
    wait_for(lambda: len(ntfy.bot_messages(TOPIC)) > count, what=f"the reply to {text!r}")
    return ntfy.bot_messages(TOPIC)[count]


def usage(d: Daemon, key: dict[str, Any] | None = None) -> tuple[float, int]:
    body = d.get("/api/usage", params={"key": key["id"]} if key else {}).json()
    return body["total_cost_usd"], body["requests"]


def test_a_keys_channel_runs_as_the_key_and_tells_the_sender_once_it_is_revoked(d: Daemon, ntfy: FakeNtfy) -> None:
    r = d.post("/api/keys", json={"name": f"k-{uuid.uuid4().hex[:6]}", "scopes": ["read", "manage"],
                                  "agents": ["helper"]})
    assert r.status_code == 201, r.text
    key = r.json()
    configure(d, ntfy, key)
    assert next(c for c in d.get("/api/channels").json() if c["name"] == "ntfy")["key_id"] == key["id"]
    before_cost, before_requests = usage(d)

    assert ask(ntfy, "hello from the key's channel") == "echo: hello from the key's channel"
    # The run is the key's: all the daemon's new spend is the key's, counted in its day.
    cost, requests_ = usage(d, key)
    assert requests_ == 1 and cost > 0
    total_cost, total_requests = usage(d)
    assert (total_requests - before_requests, total_cost - before_cost) == (1, pytest.approx(cost, rel=1e-9))
    assert d.get(f"/api/keys/{key['id']}").json()["spent_usd_today"] == round(cost, 10)

    assert d.request("PATCH", f"/api/keys/{key['id']}", json={"enabled": False}).status_code == 200
    assert ask(ntfy, "while disabled") == f"Sorry, this channel may not answer now: API key '{key['name']}' is disabled"
    refused = audit(d, "channel.refused", "ntfy")[0]["detail"]
    assert (refused["key_id"], refused["reason"]) == (key["id"], f"API key '{key['name']}' is disabled")

    moved = {"enabled": True, "agents": ["someone-else"]}
    assert d.request("PATCH", f"/api/keys/{key['id']}", json=moved).status_code == 200
    assert ask(ntfy, "out of reach") == (f"Sorry, this channel may not answer now: API key '{key['name']}' "
                                         "may not reach agent 'helper'")

    assert usage(d, key)[1] == 1  # neither refused message ran

    assert d.delete(f"/api/keys/{key['id']}").status_code == 200
    assert ask(ntfy, "after deletion") == ("Sorry, this channel may not answer now: the API key that created it "
                                           f"was deleted (key id {key['id']})")
    assert usage(d)[1] == total_requests

    # Configured again by the admin, the channel is the admin's: its runs are nobody's key's.
    configure(d, ntfy, None)
    assert next(c for c in d.get("/api/channels").json() if c["name"] == "ntfy")["key_id"] is None
    assert ask(ntfy, "admin's again") == "echo: admin's again"
    assert usage(d)[1] == total_requests + 1
