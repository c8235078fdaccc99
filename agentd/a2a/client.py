"""Calling remote A2A agents: read a card, send a message (the a2a_discover and a2a_send tools).

Remote agents come from `[a2a] agents` in config.toml (`{name, url, api_key_env}`) or from
an earlier a2a_discover, remembered by the card's name for the daemon's lifetime. The HTTP
session and the address checks are the caller's (the tools use web_fetch's SSRF guard).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable

from agentd.a2a.wire import to_v1
from agentd.config.parse import RemoteAgent, remote_agents  # noqa: F401 - the client's own names

CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")
V03, V1 = "0.3", "1.0"
MAX_RESPONSE_BYTES = 4 * 1024 * 1024


class A2AClientError(Exception):
    """A remote agent could not be reached or answered something unusable."""


def _json(response: Any, what: str) -> Any:
    if response.status_code != 200:
        raise A2AClientError(f"{what} answered HTTP {response.status_code}")
    data = bytearray()
    for chunk in response.iter_content(65536):
        data += chunk
        if len(data) > MAX_RESPONSE_BYTES:
            raise A2AClientError(f"{what} answered more than {MAX_RESPONSE_BYTES} bytes")
    import json

    try:
        return json.loads(bytes(data))
    except ValueError:
        raise A2AClientError(f"{what} did not answer JSON") from None


def card_endpoint(card: dict[str, Any]) -> tuple[str, str]:
    """The JSON-RPC endpoint a card names and the A2A version to speak there: a 1.x interface
    of the 1.0 list first, then another JSON-RPC one of it, then `url`, spoken as 0.3."""
    jsonrpc = [i for i in card.get("supportedInterfaces") or [] if isinstance(i, dict)
               and str(i.get("protocolBinding", "")).upper() == "JSONRPC" and isinstance(i.get("url"), str)]
    for interface in jsonrpc:
        if str(interface.get("protocolVersion", "")).split(".")[0] == "1":
            return interface["url"], V1
    if jsonrpc:
        return jsonrpc[0]["url"], V03
    if isinstance(card.get("url"), str) and card["url"]:
        return card["url"], V03
    raise A2AClientError("the agent card names no JSON-RPC endpoint")


def summary(card: dict[str, Any], card_url: str) -> dict[str, Any]:
    """What a model needs of a card."""
    skills = [{k: s.get(k) for k in ("id", "name", "description", "tags") if k in s}
              for s in card.get("skills") or [] if isinstance(s, dict)]
    protocols = [f"{i.get('protocolBinding')} {i.get('protocolVersion', '')}".strip()
                 for i in card.get("supportedInterfaces") or [] if isinstance(i, dict)]
    if not protocols:
        protocols = [f"{card.get('preferredTransport', 'JSONRPC')} {card.get('protocolVersion', '')}".strip()]
    try:
        endpoint, _ = card_endpoint(card)
    except A2AClientError:
        endpoint = ""
    return {"name": card.get("name"), "description": card.get("description"), "url": endpoint,
            "card_url": card_url, "version": card.get("version"), "protocols": protocols,
            "streaming": bool((card.get("capabilities") or {}).get("streaming")),
            "auth_required": bool(card.get("securitySchemes")), "skills": skills}


class A2AClient:
    """Reads remote cards and sends messages; remembers the agents it discovered by name."""

    def __init__(self, configured: list[RemoteAgent], environ: Callable[[str], str | None],
                 timeout: float = 120.0) -> None:
        self.configured = {a.name: a for a in configured}
        self.environ = environ
        self.timeout = timeout
        self._known: dict[str, str] = {}
        self._lock = threading.Lock()

    def headers_for(self, url: str) -> dict[str, str]:
        """The configured key for `url`: sent only to the configured agent's own origin."""
        from urllib.parse import urlsplit

        target = urlsplit(url)
        for agent in self.configured.values():
            configured = urlsplit(agent.url)
            if agent.api_key_env and (configured.scheme, configured.netloc.lower()) == (
                    target.scheme, target.netloc.lower()):
                key = self.environ(agent.api_key_env)
                if key:
                    return {"Authorization": f"Bearer {key}"}
        return {}

    def resolve(self, name: str) -> str:
        """The URL of a configured or discovered agent."""
        if name in self.configured:
            return self.configured[name].url
        with self._lock:
            url = self._known.get(name)
        if url is None:
            names = sorted(set(self.configured) | set(self._known))
            raise A2AClientError(f"no A2A agent named '{name}' (known: {', '.join(names) or 'none'}; "
                                 "discover one with a2a_discover or list it under [a2a] agents)")
        return url

    def fetch_card(self, url: str, get: Callable[..., Any], check: Callable[[str], None]) -> tuple[dict, str]:
        """(card, its URL): `url` is the card itself or the base URL it is under."""
        candidates = [url] if url.rstrip("/").endswith(".json") else [url.rstrip("/") + p for p in CARD_PATHS]
        for candidate in candidates:
            check(candidate)
            with get(candidate, headers={"Accept": "application/json", **self.headers_for(candidate)},
                     timeout=self.timeout, stream=True, allow_redirects=False) as response:
                # A 404 moves on to the next path; the last path's answer is the card or the error.
                if response.status_code == 404 and candidate is not candidates[-1]:
                    continue
                card = _json(response, f"the agent card at {candidate}")
            break
        if not isinstance(card, dict) or not isinstance(card.get("name"), str):
            raise A2AClientError(f"{candidate} is not an A2A agent card (no name)")
        with self._lock:
            self._known[card["name"]] = candidate
        return card, candidate

    def endpoint(self, url: str, get: Callable[..., Any], check: Callable[[str], None]) -> tuple[str, str]:
        """(JSON-RPC endpoint, A2A version) from a card URL, a base URL with a card, or the
        endpoint itself (spoken as 0.3, which a URL without a card cannot rule out)."""
        from urllib.parse import urlsplit

        if url.rstrip("/").endswith(".json") or urlsplit(url).path in ("", "/"):
            return card_endpoint(self.fetch_card(url, get, check)[0])
        return url, V03

    def send(self, endpoint: str, text: str, context_id: str, post: Callable[..., Any],
             check: Callable[[str], None], version: str = V03) -> str:
        """`message/send` (1.0: `SendMessage`); the answer's text (A2AClientError when the task failed)."""
        check(endpoint)
        message = {"kind": "message", "role": "user", "messageId": str(uuid.uuid4()), "contextId": context_id,
                   "parts": [{"kind": "text", "text": text}]}
        headers = {"Accept": "application/json", **self.headers_for(endpoint)}
        if version == V1:
            method, message = "SendMessage", to_v1(message)
            headers["A2A-Version"] = V1
        else:
            method = "message/send"
        request = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": {"message": message}}
        with post(endpoint, json=request, headers=headers,
                  timeout=self.timeout, stream=True, allow_redirects=False) as response:
            answer = _json(response, f"the A2A endpoint {endpoint}")
        if not isinstance(answer, dict):
            raise A2AClientError("the remote agent answered something that is not JSON-RPC")
        if isinstance(answer.get("error"), dict):
            error = answer["error"]
            raise A2AClientError(f"the remote agent refused: {error.get('message')} (code {error.get('code')})")
        result = answer.get("result")
        if isinstance(result, dict) and len(result) == 1 and isinstance(result.get("task") or result.get("message"),
                                                                        dict):
            result = result.get("task") or result.get("message")  # the A2A 1.0 wrapping
        if not isinstance(result, dict):
            raise A2AClientError("the remote agent's answer has no result")
        return _answer_text(result)


def _parts_text(parts: Any) -> str:
    return "".join(p["text"] for p in parts or [] if isinstance(p, dict) and isinstance(p.get("text"), str))


def _answer_text(result: dict[str, Any]) -> str:
    if "parts" in result:  # a Message
        return _parts_text(result["parts"])
    status = result.get("status") if isinstance(result.get("status"), dict) else {}
    state = str(status.get("state", "")).lower().replace("task_state_", "")
    status_text = _parts_text((status.get("message") or {}).get("parts")) if isinstance(
        status.get("message"), dict) else ""
    if state in ("failed", "canceled", "rejected"):
        raise A2AClientError(f"the remote task ended {state}: {status_text or 'no reason given'}")
    texts = [_parts_text(a.get("parts")) for a in result.get("artifacts") or [] if isinstance(a, dict)]
    text = "\n".join(t for t in texts if t)
    if text:
        return text
    if status_text:
        return status_text
    if state and state != "completed":
        return f"[the remote task is {state}; no answer yet]"
    return ""
