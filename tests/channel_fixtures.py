"""Shared fixtures and helpers for the channel tests: a daemon wired to the fake LLM
with one agent, configure/audit helpers, and waiting for conditions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests

from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, make_home

AGENT_TOML = 'name = "helper"\nprofile = "minimal"\n[model]\nprovider = "default"\nmodel = "default"\n'


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
             what: str = "condition", explain: Callable[[], Any] | None = None) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test on timeout (with
    what `explain()` returns then, to tell a lost message from a dead connection)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    context = f"; {explain()!r}" if explain is not None else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{context}")


def audit(daemon: Daemon, event: str = "", subject: str = "") -> list[dict[str, Any]]:
    """Audit entries (newest first), optionally only one event name / subject."""
    rows = daemon.get("/api/audit/recent?limit=500").json()
    return [r for r in rows if (not event or r["event"] == event) and (not subject or r["subject"] == subject)]


def configure(daemon: Daemon, name: str, **keys: Any) -> dict[str, Any]:
    response = daemon.post(f"/api/channels/{name}/configure", json=keys)
    assert response.status_code == 200, response.text
    return response.json()


def channel(daemon: Daemon, name: str) -> dict[str, Any]:
    return next(c for c in daemon.get("/api/channels").json() if c["name"] == name)


def wait_active(daemon: Daemon, name: str, timeout: float = 30.0) -> None:
    # On a timeout: the channel as listed (its `error`) and the daemon's last log lines of it.
    wait_for(lambda: channel(daemon, name)["active"], timeout, what=f"{name} active",
             explain=lambda: (channel(daemon, name), [line for line in daemon.log().splitlines()
                                                      if name in line.lower()][-5:]))


def remove(daemon: Daemon, name: str) -> None:
    response = daemon.delete(f"/api/channels/{name}/configure")
    assert response.status_code == 200, response.text


def stop_closes_the_listener(daemon: Daemon, name: str, send: Callable[[], Any], **keys: Any) -> None:
    """Removing channel `name` stops it and closes its webhook port (`send()` posts there and
    must fail to connect); with `keys`, configuring it again brings it back."""
    remove(daemon, name)
    assert channel(daemon, name)["active"] is False
    with pytest.raises(requests.ConnectionError):
        send()
    if keys:
        configure(daemon, name, **keys)
        wait_active(daemon, name)


def start_channel_daemon(root: Path, fake_llm, env: dict[str, str] | None = None,
                         extra_config: str = "", remember: bool = False) -> Daemon:
    # The channel tests are about the adapters: their daemons remember no exchange, except
    # for a test of what a channel's conversations remember (the default configuration).
    home = make_home(root, llm_config(fake_llm, extra_config + ("" if remember else NO_REMEMBERING)))
    daemon = Daemon(home, env_extra={**LLM_ENV, **(env or {})}).start()
    created = daemon.post("/api/agents", json={"manifest_toml": AGENT_TOML})
    assert created.status_code == 201, created.text
    return daemon


@pytest.fixture(scope="module")
def channel_daemon(tmp_path_factory, fake_llm) -> Iterator[Daemon]:
    """A daemon (fake LLM behind it) with one agent, `helper`; channel secrets in its env."""
    daemon = start_channel_daemon(tmp_path_factory.mktemp("channels"), fake_llm, env=CHANNEL_ENV)
    yield daemon
    daemon.stop()


# Secrets the channel tests' daemons see (the fakes accept exactly these).
CHANNEL_ENV = {"WEBHOOK_TEST_SECRET": "s3cret-hmac", "TELEGRAM_BOT_TOKEN": "123456:TESTTOKEN",
               "MATRIX_ACCESS_TOKEN": "syt_matrix_token", "NTFY_TOKEN": "tk_ntfy",
               "GOTIFY_APP_TOKEN": "AppTokenX", "GOTIFY_CLIENT_TOKEN": "ClientTokenY",
               "MATTERMOST_TOKEN": "mm-token", "EMAIL_PASSWORD": "mailpass"}
# The signed-webhook family.
CHANNEL_ENV.update({"LINE_CHANNEL_SECRET": "line-chan-secret", "LINE_CHANNEL_ACCESS_TOKEN": "line-access-tok"})
CHANNEL_ENV.update({"MESSENGER_APP_SECRET": "fb-app-secret", "MESSENGER_PAGE_TOKEN": "EAAGpage",
                    "MESSENGER_VERIFY_TOKEN": "fb-verify-me"})
CHANNEL_ENV.update({"WHATSAPP_APP_SECRET": "wa-app-secret", "WHATSAPP_ACCESS_TOKEN": "EAAGwa",
                    "WHATSAPP_VERIFY_TOKEN": "wa-verify-me"})
CHANNEL_ENV.update({"VIBER_AUTH_TOKEN": "445da6az1s345z78-dazcczb2542zv51a-e0vc5fva17480im9"})
# The streaming/relay family (mastodon, gitter, nostr, webex).
CHANNEL_ENV.update({"WEBEX_BOT_TOKEN": "NjIwebex-bot-token", "MASTODON_ACCESS_TOKEN": "masto-token",
                    "GITTER_TOKEN": "syt_gitter_token",
                    "NOSTR_PRIVATE_KEY": "7f7ff03d123792d6ac594bfa67bf6d0c0ab55b6b1fdb6249303fe861f1ccba9a",
                    "NOSTR_NSEC": "nsec10allq0gjx7fddtzef0ax00mdps9t2kmtrldkyjfs8l5xruwvh2dq0lhhkp",
                    "NOSTR_BAD_KEY": "nsec1notakey"})
# Enterprise webhook adapters: teams, google_chat, feishu, dingtalk.
CHANNEL_ENV.update({"DINGTALK_ACCESS_TOKEN": "dt-robot-token", "DINGTALK_SECRET": "SECdingtalk-signing-secret"})
CHANNEL_ENV.update({"FEISHU_APP_SECRET": "feishu-app-secret", "FEISHU_ENCRYPT_KEY": "kudryavtsev-encrypt-key",
                    "FEISHU_VERIFICATION_TOKEN": "v-token-feishu"})
CHANNEL_ENV.update({"TEAMS_APP_PASSWORD": "teams-client-secret~x"})
# Webhook adapters, part 2 (threema, pumble, flock). The Threema key is a test-only key pair.
CHANNEL_ENV.update({"THREEMA_SECRET": "threema-api-secret",
                    "THREEMA_PRIVATE_KEY": "private:a403ce7f17e896c88ae8ec1f0421fe3346e82fa6f8f730083f6a53f0ac2000f6",
                    "PUMBLE_BOT_TOKEN": "pumble-bot-token", "PUMBLE_APP_KEY": "pumble-app-key",
                    "PUMBLE_SIGNING_SECRET": "pumble-signing-secret",
                    "FLOCK_BOT_TOKEN": "flock-bot-token", "FLOCK_APP_SECRET": "869eb1d0-419d-4747-98b4-6d81360a6681"})
