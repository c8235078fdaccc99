"""Regenerate agentd/data/channels.json from the reference catalogue.

Keeps the spec's 40 adapters (`in_spec_40`), the fields the API shows, each adapter's
supported config keys with their defaults and value kinds, and agentd's own additions
(the `EXTRA_KEYS` below: base URLs and knobs tests and self-hosted servers need, and
what the README's channel table says about each adapter's inbound mode).

    python scripts/build_channel_data.py [/path/to/reference/channels.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = Path("/work/shared/reference/channels.json")
TARGET = ROOT / "agentd" / "data" / "channels.json"

KINDS = {"String": "text", "Option<String>": "text", "u16": "number", "u32": "number",
         "u64": "number", "i64": "number", "f64": "number", "bool": "bool",
         "Vec<String>": "list", "Vec<i64>": "list", "Vec<u64>": "list"}

# agentd's own keys on top of the reference ones: (key, kind, default).
EXTRA_KEYS: dict[str, list[tuple[str, str, object]]] = {
    "telegram": [("long_poll_secs", "number", 25)],
    "matrix": [("long_poll_secs", "number", 25)],
    "email": [("imap_security", "text", "tls"), ("smtp_security", "text", "starttls"),
              ("from_address", "text", ""), ("test_recipient", "text", "")],
    "irc": [("tls_verify", "bool", True), ("send_interval_secs", "number", 0.5)],
    "ntfy": [],
    "gotify": [],
    "mattermost": [("default_channel_id", "text", ""), ("webhook_url", "text", "")],
    "webhook": [],
}
COMMON = [("default_agent", "text", None), ("allowed_users", "list", []),
          ("allowed_channels", "list", [])]
# Inbound mode, whether the platform must reach us (public URL) and what we use.
INBOUND = {
    "telegram": "long-poll", "matrix": "long-poll (/sync)", "email": "IMAP polling",
    "irc": "TCP line socket", "ntfy": "SSE stream", "gotify": "WebSocket",
    "mattermost": "WebSocket", "webhook": "webhook (own listener)",
}

# Polling / line-socket / real-server adapters: base URLs and poll knobs.
EXTRA_KEYS.update({
    "signal": [("receive_timeout_secs", "number", 2), ("poll_interval_secs", "number", 0.5)],
    "keybase": [],
    "reddit": [("api_url", "text", "https://oauth.reddit.com"), ("auth_url", "text", "https://www.reddit.com"),
               ("poll_interval_secs", "number", 10)],
    "bluesky": [("poll_interval_secs", "number", 10)],
    "linkedin": [("api_url", "text", "https://api.linkedin.com"), ("poll_interval_secs", "number", 15)],
    "twist": [("api_url", "text", "https://api.twist.com"), ("poll_interval_secs", "number", 5)],
    "zulip": [("long_poll_secs", "number", 30)],
    "discourse": [("poll_interval_secs", "number", 5)],
    "nextcloud": [("long_poll_secs", "number", 20), ("poll_interval_secs", "number", 2)],
    "rocketchat": [("poll_interval_secs", "number", 2)],
    "twitch": [("server", "text", "irc.chat.twitch.tv"), ("port", "number", 6667), ("use_tls", "bool", False),
               ("tls_verify", "bool", True), ("send_interval_secs", "number", 1.5)],
    "xmpp": [("use_tls", "bool", True), ("tls_verify", "bool", True), ("nickname", "text", "agentd")],
    "mumble": [("tls_verify", "bool", False), ("ping_secs", "number", 15)],
})
INBOUND.update({
    "signal": "polling (signal-cli REST)", "keybase": "none (needs the Keybase client)",
    "reddit": "polling", "bluesky": "polling (notifications)", "linkedin": "polling",
    "twist": "polling", "zulip": "long-poll (event queue)", "discourse": "polling",
    "nextcloud": "long-poll (lookIntoFuture)", "rocketchat": "polling", "twitch": "TCP line socket (IRC)",
    "xmpp": "XMPP stream (slixmpp)", "mumble": "TLS socket (Mumble protocol)",
})
# Gateway WebSocket adapters: base URLs (tests point them at the fakes) and
# Slack's optional Events API listener.
EXTRA_KEYS.update({
    "discord": [("api_url", "text", "https://discord.com/api/v10"), ("gateway_url", "text", "")],
    "slack": [("api_url", "text", "https://slack.com/api"), ("signing_secret_env", "text", "SLACK_SIGNING_SECRET"),
              ("webhook_port", "number", 0), ("mode", "text", "socket")],
    "revolt": [("ping_secs", "number", 20)],
    "guilded": [],
})
INBOUND.update({
    "discord": "Gateway WebSocket v10", "slack": "Socket Mode WebSocket, or the Events API webhook (mode = \"events\")",
    "revolt": "Bonfire WebSocket", "guilded": "none (Guilded shut down on 19 December 2025)",
})

# Enterprise webhook adapters (teams, google_chat, feishu, dingtalk): the
# platforms' key/token/API URLs (tests point them at fakes) and what verifies inbound calls.
EXTRA_KEYS.update({
    "teams": [("openid_url", "text", "https://login.botframework.com/v1/.well-known/openidconfiguration"),
              ("token_url", "text", "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"),
              ("service_url", "text", "https://smba.trafficmanager.net/teams/")],
    "google_chat": [("project_number", "text", ""),
                    ("certs_url", "text", "https://www.googleapis.com/service_accounts/v1/metadata/x509/"
                                          "chat@system.gserviceaccount.com"),
                    ("token_url", "text", ""), ("api_url", "text", "https://chat.googleapis.com")],
    "feishu": [("api_url", "text", ""), ("verification_token_env", "text", "")],
    "dingtalk": [("api_url", "text", "https://oapi.dingtalk.com"), ("app_key", "text", ""),
                 ("app_secret_env", "text", "DINGTALK_APP_SECRET"), ("openapi_url", "text", "https://api.dingtalk.com")],
})
INBOUND.update({
    "teams": "webhook (Bot Framework activities, JWT)", "google_chat": "webhook (Chat events, JWT)",
    "feishu": "webhook (event subscription v2)", "dingtalk": "webhook (outgoing robot callbacks)",
})
# Reference defaults agentd changes: Feishu's long-connection mode is not implemented;
# Telegram long-polls, so no pause is needed between getUpdates calls.
DEFAULT_OVERRIDES = {("feishu", "mode"): "webhook", ("telegram", "poll_interval_secs"): 0}

# Descriptions that must say what the platform needs beyond agentd.
DESCRIPTIONS = {
    "guilded": "Guilded bot adapter. Guilded shut down on 19 December 2025 (Roblox ended the service), "
               "so its bot API no longer exists: the configuration is validated and saved, but the "
               "adapter cannot connect.",
    "keybase": "Keybase chat bot adapter. Needs the Keybase client binary (`keybase chat api`), "
               "which agentd does not ship: the configuration is validated and saved, but the "
               "adapter cannot connect.",
}


# Streaming/relay adapters (mastodon, gitter, nostr, webex).
EXTRA_KEYS.update({
    "webex": [("webhook_url", "text", ""), ("webhook_port", "number", 8458),
              ("api_url", "text", "https://webexapis.com")],
    "gitter": [("homeserver_url", "text", "https://gitter.im"), ("long_poll_secs", "number", 25)],
    "mastodon": [], "nostr": [],
})
INBOUND.update({
    "webex": "webhook (own listener, registered via /v1/webhooks)",
    "gitter": "long-poll (Matrix /sync on Gitter's homeserver)",
    "mastodon": "SSE stream (/api/v1/streaming/user)", "nostr": "WebSocket relays (NIP-01)",
})
DESCRIPTIONS["gitter"] = ("Gitter adapter. Gitter moved to Matrix in February 2023 and its own REST and streaming "
                          "APIs were shut down, so this adapter speaks the Matrix client-server API to Gitter's "
                          "homeserver (gitter.im): a Matrix access token and a Matrix room id (!...:gitter.im).")


def kind_of(rust_type: str) -> str:
    if rust_type.startswith("Option<") and rust_type[7:-1] in KINDS:
        return KINDS[rust_type[7:-1]]
    if rust_type.startswith("HashMap") or rust_type == "ChannelOverrides":
        return "table"
    return KINDS.get(rust_type, "text")


def build(source: Path) -> list[dict]:
    out = []
    for item in json.loads(source.read_text()):
        if not item.get("in_spec_40"):
            continue
        keys: dict[str, dict] = {}
        for key, kind, default in COMMON:
            keys[key] = {"kind": kind, "default": default}
        for spec in item["config_keys_supported"]:
            keys[spec["key"]] = {"kind": kind_of(spec["rust_type"]), "default": spec["default"]}
        for field in item["fields"]:  # a field the UI shows is always a valid key
            kind = {"number": "number", "list": "list"}.get(field["type"], "text")
            keys.setdefault(field["key"], {"kind": kind, "default": None})
        for key, kind, default in EXTRA_KEYS.get(item["name"], []):
            keys[key] = {"kind": kind, "default": default, "agentd": True}
        for (name, key), default in DEFAULT_OVERRIDES.items():
            if name == item["name"]:
                keys[key]["default"] = default
        out.append({
            "name": item["name"], "display_name": item["display_name"], "icon": item["icon"],
            "description": DESCRIPTIONS.get(item["name"], item["description"]), "category": item["category"],
            "difficulty": item["difficulty"], "setup_time": item["setup_time"],
            "quick_setup": item["quick_setup"], "setup_type": item["setup_type"],
            "fields": item["fields"], "setup_steps": item["setup_steps"],
            "config_template": item["config_template"], "protocol": item["protocol"],
            "is_qr_adapter": item["is_qr_adapter"], "inbound": INBOUND.get(item["name"], ""),
            "keys": keys,
        })
    if len(out) != 40:
        raise SystemExit(f"expected the spec's 40 adapters, found {len(out)}")
    return out


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SOURCE
    data = build(source)
    TARGET.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(data)} adapters to {TARGET}")


if __name__ == "__main__":
    main()
