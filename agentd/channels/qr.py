"""QR login for the WhatsApp personal-account adapter through a WhatsApp Web gateway.

The gateway (env WHATSAPP_WEB_GATEWAY_URL) speaks the original system's protocol:
`POST <gw>/login/start` -> {qr_data_url, session_id, connected} and
`GET <gw>/login/status?session_id=` -> {connected, message, expired, phone_number?}.
agentd answers in the spec's shapes and renders a raw QR string as a PNG data URI.
"""

from __future__ import annotations

import base64
import io
import os
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from agentd.errors import AgentdError, BadRequest, NotFound
from agentd.timestamps import iso, utcnow

if TYPE_CHECKING:
    import requests

QR_CHANNEL = "whatsapp"
GATEWAY_ENV = "WHATSAPP_WEB_GATEWAY_URL"
QR_LIFETIME = timedelta(seconds=60)  # WhatsApp rotates its login QR about once a minute
PNG_PREFIX = "data:image/png;base64,"


class GatewayUnavailable(AgentdError):
    status = 503


def qr_png_data_url(value: str) -> str:
    """A PNG data URI for the gateway's QR: passed through when it already is one."""
    if value.startswith(PNG_PREFIX):
        return value
    import segno

    buffer = io.BytesIO()
    segno.make(value, error="m").save(buffer, kind="png", scale=6, border=2)
    return PNG_PREFIX + base64.b64encode(buffer.getvalue()).decode("ascii")


class QrLogins:
    """Sessions started through the gateway, with their latest QR and its expiry."""

    def __init__(self) -> None:
        self._sessions: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._http: requests.Session | None = None

    @property
    def http(self) -> requests.Session:
        """The gateway session, made on first use (requests is not loaded at start)."""
        with self._lock:
            if self._http is None:
                import requests

                self._http = requests.Session()
                self._http.trust_env = False
            return self._http

    @staticmethod
    def check_channel(name: str, known: bool) -> None:
        if not known:
            raise NotFound(f"unknown channel {name!r}")
        if name != QR_CHANNEL:
            raise BadRequest(f"channel {name} has no QR login (only {QR_CHANNEL} does)")

    def _gateway(self) -> str:
        url = os.environ.get(GATEWAY_ENV, "").strip().rstrip("/")
        if not url:
            raise GatewayUnavailable(f"WhatsApp Web gateway not configured: set {GATEWAY_ENV} to the "
                                     "URL of a running gateway (e.g. http://127.0.0.1:3009)")
        return url

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        url = self._gateway() + path
        import requests

        try:
            response = self.http.request(method, url, timeout=15, **kwargs)
            data = response.json()
        except (requests.RequestException, ValueError) as exc:
            raise AgentdError(f"WhatsApp Web gateway unreachable: {type(exc).__name__}", status=502) from None
        if response.status_code >= 400 or not isinstance(data, dict):
            raise AgentdError(f"WhatsApp Web gateway answered HTTP {response.status_code}", status=502)
        return data

    def start(self) -> dict[str, Any]:
        """POST /api/channels/whatsapp/qr/start."""
        data = self._call("POST", "/login/start", json={})
        session_id = str(data.get("session_id") or "")
        if not session_id:
            raise AgentdError("WhatsApp Web gateway gave no session_id", status=502)
        with self._lock:
            self._sessions[session_id] = {"qr": self._qr_of(data), "at": utcnow()}
        status = "connected" if data.get("connected") else "waiting_for_scan"
        return {"session_id": session_id, "status": status}

    def status(self, session_id: str) -> dict[str, Any]:
        """GET /api/channels/whatsapp/qr/status?session_id=."""
        self._gateway()  # 503 first when no gateway is configured
        if not session_id:
            raise BadRequest("session_id query parameter is required")
        data = self._call("GET", "/login/status", params={"session_id": session_id})
        if data.get("connected"):
            return {"status": "connected", "phone_number": str(data.get("phone_number") or "")}
        fresh = self._qr_of(data)
        with self._lock:
            known = self._sessions.get(session_id)
            if known is None:
                # Started elsewhere (or before a restart): the gateway is the authority.
                if not fresh and not data.get("expired"):
                    raise NotFound(f"unknown QR session {session_id!r}")
                known = self._sessions[session_id] = {"qr": fresh, "at": utcnow()}
        if fresh:
            known.update(qr=fresh, at=utcnow())
        expires = known["at"] + QR_LIFETIME
        if data.get("expired"):
            return {"status": "expired", "message": str(data.get("message") or "QR code expired; start again"),
                    "expires_at": iso(expires)}
        if not known["qr"]:
            raise AgentdError("WhatsApp Web gateway gave no QR code", status=502)
        return {"status": "waiting_for_scan", "qr_code": known["qr"], "expires_at": iso(expires)}

    @staticmethod
    def _qr_of(data: dict[str, Any]) -> str:
        value = data.get("qr_data_url") or data.get("qr") or data.get("qr_code") or ""
        return qr_png_data_url(str(value)) if value else ""
