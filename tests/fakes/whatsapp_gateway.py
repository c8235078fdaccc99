"""A fake WhatsApp Web (Baileys) gateway speaking the original system's gateway protocol:
POST /login/start and GET /login/status (QR login), GET /health ({status, connected,
session_id}), POST /send ({to: "+<phone>", text} -> {success: true}; 500 {error} while not
connected). `scan()` plays the phone scanning the QR. `user_says()` does what the gateway
does with an incoming WhatsApp message: POST `{forward_url}/api/agents/<agent>/message`
with `{message, metadata: {channel, sender, sender_name}}`, and send back any non-empty
`response` (recorded like a /send, with `via: "response"`)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import requests
from flask import Flask, jsonify, request

from fakes.http import FakeServer

QR = "2@fake-baileys-qr,pubkey,identity,adv"


class FakeGateway(FakeServer):
    def __init__(self) -> None:
        self.connected = False
        self.session_id = str(uuid.uuid4())
        self.forward_url = ""  # OPENFANG_URL of the real gateway
        self.sent: list[dict[str, Any]] = []  # {to, text, via, at}
        app = Flask("fake-whatsapp-gateway")

        def state() -> dict[str, Any]:
            return {"status": "connected" if self.connected else "qr_ready", "connected": self.connected,
                    "message": "Connected to WhatsApp" if self.connected else "Scan this QR code with WhatsApp → Linked Devices",
                    "qr_expired": False, "qr_data_url": "" if self.connected else QR, "session_id": self.session_id}

        @app.post("/login/start")
        def login_start():
            return jsonify(state())

        @app.get("/login/status")
        def login_status():
            return jsonify({**state(), "phone_number": "+15550001"} if self.connected else state())

        @app.get("/health")
        def health():
            return jsonify({"status": "ok", "connected": self.connected, "session_id": self.session_id})

        @app.post("/send")
        def send():
            body = request.get_json(silent=True) or {}
            if not body.get("to") or not body.get("text"):
                return jsonify({"error": 'Missing "to" or "text"'}), 400
            if not self.connected:
                return jsonify({"error": "WhatsApp not connected"}), 500
            self.sent.append({"to": body["to"], "text": body["text"], "via": "send", "at": time.time()})
            return jsonify({"success": True})

        super().__init__(app)

    def scan(self) -> None:
        self.connected = True

    def user_says(self, phone: str, text: str, agent: str = "assistant", url: str | None = None) -> requests.Response:
        payload = {"message": text, "metadata": {"channel": "whatsapp", "sender": phone, "sender_name": f"User {phone[-4:]}"}}
        response = requests.post(f"{url or self.forward_url}/api/agents/{agent}/message", json=payload, timeout=10)
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        reply = (answer.get("response") or answer.get("message") or answer.get("text") or "") if isinstance(answer, dict) else ""
        if reply and response.status_code == 200:  # the real gateway sends any answer straight back
            self.sent.append({"to": phone, "text": reply, "via": "response", "at": time.time()})
        return response

    def replies(self, phone: str) -> list[str]:
        return [s["text"] for s in self.sent if s["to"] == phone]
