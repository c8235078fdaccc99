"""A real prosody (Debian package) for the XMPP tests, in a temp dir on a free port:
c2s with optional STARTTLS (self-signed certificate), SCRAM logins, users registered
with prosodyctl, and a MUC component `conference.localhost`. With `file_share`, prosody's
own XEP-0363 component `upload.localhost` (mod_http_file_share) on an HTTP port of its
own, its URLs on `127.0.0.1:<http_port>`. `XmppUser` is the platform
user: a plain slixmpp client on its own event-loop thread."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

from agentd.channels.adapters.xmpp import drain
from fakes.servers import ServerProcess, need
from support import free_port

DOMAIN, MUC, UPLOAD = "localhost", "conference.localhost", "upload.localhost"
UPLOAD_NS = "urn:xmpp:http:upload:0"


class Prosody(ServerProcess):
    down_for = 0.5

    def __init__(self, file_share: bool = False, file_limit: int = 1024 * 1024) -> None:
        self.binary = need("prosody")
        self.ctl = need("prosodyctl")
        # prosody may drop to its own user: the directory must be traversable by it.
        self.root = Path(tempfile.mkdtemp(prefix="agentd-prosody-"))
        os.chmod(self.root, 0o755)
        self.port = free_port()
        self.http_port = free_port() if file_share else 0
        (self.root / "data").mkdir()
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        f"/CN={DOMAIN}", "-keyout", str(self.root / "key.pem"), "-out", str(self.root / "cert.pem")],
                       check=True, capture_output=True)
        root = self.root
        self.config = root / "prosody.cfg.lua"
        self.config.write_text(f"""
pidfile = "{root}/prosody.pid"
data_path = "{root}/data"
run_as_root = true
interfaces = {{ "127.0.0.1" }}
c2s_ports = {{ {self.port} }}
c2s_direct_tls_ports = {{ }}
s2s_ports = {{ }}
http_ports = {{ {self.http_port or ""} }}
http_interfaces = {{ "127.0.0.1" }}
http_default_host = "{UPLOAD}"
https_ports = {{ }}
admin_socket = "{root}/admin.sock"
log = {{ info = "{root}/prosody.log" }}
authentication = "internal_hashed"
c2s_require_encryption = false
allow_registration = false
modules_enabled = {{ "roster"; "saslauth"; "tls"; "disco"; "ping"; "presence"; "message"; "iq" }}
modules_disabled = {{ "s2s"; "admin_shell" }}
certificates = "{root}"
ssl = {{ key = "{root}/key.pem"; certificate = "{root}/cert.pem" }}
VirtualHost "{DOMAIN}"
Component "{MUC}" "muc"
    muc_room_locking = false
    restrict_room_creation = false
""" + (f"""
Component "{UPLOAD}" "http_file_share"
    http_external_url = "http://127.0.0.1:{self.http_port}/"
    http_file_share_size_limit = {file_limit}
""" if file_share else ""))
        for path in root.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)

    def register(self, user: str, password: str) -> None:
        subprocess.run([self.ctl, "--config", str(self.config), "register", user, DOMAIN, password],
                       check=True, capture_output=True, timeout=30)

    def start(self) -> "Prosody":
        self.launch([self.binary, "-F", "--config", str(self.config)], self.port,
                    *([self.http_port] if self.http_port else []))
        return self


class XmppUser:
    """A person on the server: logs in, chats, joins rooms; `received` collects (from, type, body)."""

    def __init__(self, server: Prosody, user: str, password: str) -> None:
        import slixmpp

        self.jid = f"{user}@{DOMAIN}"
        self.received: list[tuple[str, str, str]] = []
        self.states: list[tuple[str, str]] = []
        self.reactions: list[tuple[str, str, set[str]]] = []  # (from, message id, emoji): XEP-0444
        self.oob: list[tuple[str, str, str]] = []  # (from, body, oob url): XEP-0066 in messages
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            client = slixmpp.ClientXMPP(self.jid, password)
            client.register_plugin("xep_0045")
            client.register_plugin("xep_0085")
            client.register_plugin("xep_0444")
            client.register_plugin("xep_0066")
            client.enable_direct_tls = False
            client.ssl_context.check_hostname = False
            client.ssl_context.verify_mode = ssl.CERT_NONE

            async def session_start(_: Any) -> None:
                client.send_presence()
                await client.get_roster()
                ready.set()

            def on_message(msg: Any) -> None:
                if msg["body"]:
                    self.received.append((str(msg["from"]), msg["type"], msg["body"]))
                if msg["oob"]["url"]:
                    self.oob.append((str(msg["from"].bare), msg["body"], msg["oob"]["url"]))

            def on_state(msg: Any) -> None:  # body-less chat states do not raise "message"
                self.states.append((str(msg["from"].bare), msg["chat_state"]))

            client.add_event_handler("session_start", session_start)
            client.add_event_handler("message", on_message)
            client.add_event_handler("chatstate", on_state)
            client.add_event_handler("reactions", lambda msg: self.reactions.append(
                (str(msg["from"].bare), msg["reactions"]["id"], msg["reactions"].get_values(all_chars=True))))
            client.add_event_handler("groupchat_message", lambda m: None)  # also arrives as "message"
            self.client = client
            client.connect("127.0.0.1", server.port)
            self.loop.run_forever()
            drain(self.loop)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        if not ready.wait(15):
            raise RuntimeError(f"{self.jid} could not log in")

    def call(self, fn: Any) -> Any:
        async def run() -> Any:
            result = fn()
            return await result if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future) else result
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(15)

    def say(self, to: str, text: str, mtype: str = "chat") -> str:
        """Send `text`; the message's id."""
        def send() -> str:
            msg = self.client.make_message(mto=to, mbody=text, mtype=mtype)
            msg["id"] = msg["id"] or self.client.new_id()
            msg.send()
            return str(msg["id"])
        return self.call(send)

    def upload(self, data: bytes, filename: str, content_type: str) -> str:
        """XEP-0363 as a client does it: a slot from the upload service, the bytes PUT; the GET URL."""
        import xml.etree.ElementTree as ET

        import requests

        async def ask() -> Any:
            iq = self.client.make_iq_get(ito=UPLOAD)
            iq.append(ET.Element(f"{{{UPLOAD_NS}}}request", {"filename": filename, "size": str(len(data)),
                                                            "content-type": content_type}))
            return await iq.send(timeout=10)
        slot = self.call(ask).xml.find(f"{{{UPLOAD_NS}}}slot")
        put = slot.find(f"{{{UPLOAD_NS}}}put")
        headers = {h.get("name"): h.text for h in put.findall(f"{{{UPLOAD_NS}}}header")}
        response = requests.put(put.get("url"), data=data, headers={**headers, "Content-Type": content_type},
                                timeout=10)
        assert response.status_code == 201, response.text
        return slot.find(f"{{{UPLOAD_NS}}}get").get("url")

    def send_file(self, to: str, url: str, text: str = "") -> str:
        """A message carrying `url` out of band (the body is the URL unless `text`)."""
        def send() -> str:
            msg = self.client.make_message(mto=to, mbody=text or url, mtype="chat")
            msg["oob"]["url"] = url
            msg["id"] = msg["id"] or self.client.new_id()
            msg.send()
            return str(msg["id"])
        return self.call(send)

    def join(self, room: str, nick: str) -> None:
        self.call(lambda: self.client.plugin["xep_0045"].join_muc_wait(room, nick, maxstanzas=0, timeout=10))

    def bodies(self, sender_prefix: str) -> list[str]:
        return [body for sender, _, body in self.received if sender.startswith(sender_prefix)]

    def close(self) -> None:
        def stop() -> None:
            self.client.disconnect(wait=0)
            self.loop.call_later(0.2, self.loop.stop)
        self.loop.call_soon_threadsafe(stop)
        self.thread.join(5)
