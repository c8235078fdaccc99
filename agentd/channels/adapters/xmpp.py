"""XMPP (RFC 6120/6121) with `slixmpp`, run on its own asyncio event loop in the
adapter's thread (agentd itself stays synchronous). Logs in as `jid` (SCRAM; STARTTLS
required when `use_tls`, the default), answers direct chat messages and messages in the
MUC `rooms` (XEP-0045) addressed to its nickname ("nick: ..."); room history replayed
on join is skipped. Typing uses chat states (XEP-0085). After a lost connection it logs
in again with backoff; stop() disconnects and ends the loop.

Files: an inbound message's XEP-0066 out-of-band URL (`jabber:x:oob` `<url>`, what
clients send after an HTTP File Upload) is fetched only from the server's own upload
hosts (`file_hosts`, by default the XMPP domain and the upload service disco finds, on the
scheme's port or the usual 5280/5281/5443). Files go out with XEP-0363: the upload service
found at login is asked for a slot (`urn:xmpp:http:upload:0` `<request>`), the bytes are
PUT to the slot's URL with its headers, and the GET URL is sent as the body and as an oob
element, which clients show inline."""

from __future__ import annotations

import asyncio
import mimetypes
import ssl
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import unquote, urlsplit

import slixmpp

from agentd.channels.attachments import Attachment

from agentd.channels.adapter import Adapter, ChannelError, Conversation, Inbound
from agentd.retry import Backoff


UPLOAD_NS = "urn:xmpp:http:upload:0"
UPLOAD_PORTS = ("", ":5280", ":5281", ":5443")  # the scheme's own, prosody's and ejabberd's HTTP ports


class XmppAdapter(Adapter):
    max_message_len = 10_000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.jid = str(settings.get("jid") or "")
        self.nick = str(settings.get("nickname") or "agentd")
        self.rooms = [str(r) for r in settings.get("rooms") or []]
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client: slixmpp.ClientXMPP | None = None
        self.online = False
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        self.failing = False
        self.upload_service = ""  # the HTTP File Upload component disco found
        self.upload_limit = 0

    def start(self) -> None:
        if "@" not in self.jid:
            raise ChannelError("jid (like bot@example.org) is not set")
        self.password = self.env("password_env")
        self.loop = asyncio.new_event_loop()
        self.spawn(self._run, "loop")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        client = slixmpp.ClientXMPP(self.jid, self.password)
        for plugin in ("xep_0030", "xep_0045", "xep_0085", "xep_0066", "xep_0199", "xep_0203", "xep_0444"):
            client.register_plugin(plugin)
        client.enable_direct_tls = False  # the c2s port speaks STARTTLS (or plain text if allowed)
        client.enable_starttls = bool(self.settings.get("use_tls", True))
        client.enable_plaintext = not client.enable_starttls
        if client.enable_plaintext:  # chosen by the operator: allow SCRAM (never PLAIN) without TLS
            client.plugin["feature_mechanisms"].unencrypted_scram = True
        if not self.settings.get("tls_verify", True):
            client.ssl_context.check_hostname = False
            client.ssl_context.verify_mode = ssl.CERT_NONE
        client.add_event_handler("session_start", self._session_start)
        client.add_event_handler("message", self._message)
        client.add_event_handler("groupchat_message", self._groupchat)
        client.add_event_handler("disconnected", self._disconnected)
        client.add_event_handler("connection_failed", self._failed)
        client.add_event_handler("failed_auth", self._failed)
        self.client = client
        self._connect()
        self.loop.run_forever()
        drain(self.loop)

    def _connect(self) -> None:
        server = str(self.settings.get("server") or "") or self.jid.split("@", 1)[1].split("/", 1)[0]
        self.client.connect(server, int(self.settings.get("port") or 5222))

    async def _session_start(self, _event: Any) -> None:
        self.client.send_presence()
        await self.client.get_roster()
        for room in self.rooms:  # maxhistory=0: no replay of the room's past
            self.client.plugin["xep_0045"].join_muc(room, self.nick, maxhistory="0")
        await self._find_upload_service()
        self.online = True
        if self.failing:
            self.ctx.audit("reconnected")
        self.failing = False
        self.backoff.reset()

    async def _find_upload_service(self) -> None:
        try:
            infos = await self.client.plugin["xep_0030"].get_info_from_domain(timeout=10, cached=False)
        except Exception as exc:  # noqa: BLE001 - a server without disco still chats
            self.ctx.log.info("xmpp: no service discovery (%s): files are not sent", exc)
            return
        for info in infos:
            disco = info["disco_info"]
            if ("store", "file") in {(i[0], i[1]) for i in disco["identities"]} and UPLOAD_NS in disco["features"]:
                self.upload_service = str(info["from"])
                for form in disco.xml.iter("{jabber:x:data}x"):  # XEP-0128 extended info
                    values = {f.get("var"): (f.findtext("{jabber:x:data}value") or "").strip()
                              for f in form.iter("{jabber:x:data}field")}
                    if values.get("FORM_TYPE") == UPLOAD_NS and values.get("max-file-size", "").isdigit():
                        self.upload_limit = int(values["max-file-size"])
                return

    def _failed(self, error: Any) -> None:
        self._trouble(f"connection failed: {error}")

    def _trouble(self, error: str) -> None:
        self.online = False
        if not self.failing and not self.stopping.is_set():
            self.ctx.audit("connection_error", error=error[:300])
            self.ctx.log.warning("xmpp: %s", error)
        self.failing = True

    def _disconnected(self, reason: Any) -> None:
        self._trouble(f"disconnected: {reason}")
        if self.stopping.is_set():
            self.loop.stop()
            return
        self.loop.call_later(self.backoff.next_delay(), self._connect)

    def _message(self, msg: Any) -> None:
        if msg["type"] not in ("chat", "normal") or not msg["body"] or msg["delay"]["stamp"]:
            return
        sender = msg["from"].bare
        text, files = self._files(msg, msg["body"])
        conversation = Conversation(self.name, sender, sender, direct=True)
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text, message_id=msg["id"] or "",
                                 sender_name=msg["from"].user, mentioned=self.nick.lower() in msg["body"].lower(),
                                 attachments=files))

    @staticmethod
    def _files(msg: Any, body: str) -> tuple[str, list[Attachment]]:
        """The message's text and its out-of-band file (a body that only repeats the URL is no text)."""
        url = str(msg["oob"]["url"] or "").strip()
        if not url:
            return body, []
        name = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]) or "file"
        text = "" if body.strip() == url else body
        return text, [Attachment(name, mimetypes.guess_type(name)[0] or "", 0, url)]

    def file_hosts(self) -> set[str]:
        configured = {str(h).lower() for h in self.settings.get("file_hosts") or []}
        if configured:
            return configured
        domain = self.jid.split("@", 1)[-1].split("/", 1)[0].lower()
        hosts = {domain} | ({self.upload_service.lower()} if self.upload_service else set())
        return {host + port for host in hosts for port in UPLOAD_PORTS}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        import requests

        if self.loop is None or self.client is None or not self.online:
            raise ChannelError("not connected to the XMPP server")
        if not self.upload_service:
            raise ChannelError("xmpp: the server offers no HTTP File Upload service (XEP-0363)")
        if self.upload_limit and len(data) > self.upload_limit:
            raise ChannelError(f"xmpp: {filename} is {len(data)} bytes; the server takes {self.upload_limit}")

        async def ask() -> Any:
            iq = self.client.make_iq_get(ito=self.upload_service)
            iq.append(ET.Element(f"{{{UPLOAD_NS}}}request", {"filename": filename, "size": str(len(data)),
                                                            "content-type": content_type}))
            return await iq.send(timeout=15)

        try:
            answer = asyncio.run_coroutine_threadsafe(ask(), self.loop).result(timeout=20)
        except Exception as exc:  # noqa: BLE001 - an error iq or a timeout: the server's refusal
            raise ChannelError(f"xmpp: no upload slot for {filename} ({type(exc).__name__}: {exc})") from None
        slot = answer.xml.find(f"{{{UPLOAD_NS}}}slot")
        put = slot.find(f"{{{UPLOAD_NS}}}put") if slot is not None else None
        get = slot.find(f"{{{UPLOAD_NS}}}get") if slot is not None else None
        if put is None or get is None or not put.get("url") or not get.get("url"):
            raise ChannelError("xmpp: the upload slot has no put/get URL")
        # Only these headers may travel from the slot to the PUT (XEP-0363 §4).
        headers = {h.get("name", ""): (h.text or "").strip() for h in put.findall(f"{{{UPLOAD_NS}}}header")
                   if h.get("name", "").lower() in ("authorization", "cookie", "expires")}
        with requests.Session() as session:
            session.trust_env = False
            try:
                response = session.put(put.get("url"), data=data, timeout=60,
                                       headers={**headers, "Content-Type": content_type})
            except requests.RequestException as exc:
                raise ChannelError(f"xmpp: upload of {filename} failed ({type(exc).__name__})") from None
        if response.status_code >= 300:
            raise ChannelError(f"xmpp: upload of {filename} failed (HTTP {response.status_code})")
        url = get.get("url")
        mtype = "groupchat" if conversation.chat_id in self.rooms else "chat"

        def deliver() -> str:
            msg = self.client.make_message(mto=conversation.chat_id, mbody=url, mtype=mtype)
            msg["oob"]["url"] = url
            msg.send()
            return msg["id"]
        return self._call(deliver)

    def _groupchat(self, msg: Any) -> None:
        nick, body = msg["mucnick"], msg["body"] or ""
        if nick == self.nick or msg["delay"]["stamp"] or msg["subject"]:
            return  # our own echo, replayed history, topic changes
        # Addressed: the message starts with our nick ("nick: ...").
        addressed = any(body.lower().startswith(self.nick.lower() + mark) for mark in (":", ",", " "))
        room = msg["from"].bare
        real = self.client.plugin["xep_0045"].get_jid_property(room, nick, "jid")
        sender = str(real.bare) if real else f"{room}/{nick}"
        conversation = Conversation(self.name, room, sender, meta={"addressee": nick})
        self.ctx.deliver(Inbound(conversation, sender_id=sender,
                                 text=body[len(self.nick) + 1:].strip() if addressed else body,
                                 message_id=msg["id"] or "", sender_name=nick, sender_aliases=(nick,),
                                 mentioned=addressed, addressed=addressed))

    def _call(self, fn: Any) -> Any:
        """Run `fn` on the adapter's loop and wait for it (the sender's threads are not the loop's)."""
        if self.loop is None or self.client is None or not self.online:
            raise ChannelError("not connected to the XMPP server")

        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=15)

    def send(self, conversation: Conversation, text: str) -> str:
        mtype = "groupchat" if conversation.chat_id in self.rooms else "chat"
        prefix = f"{conversation.meta['addressee']}: " if conversation.meta.get("addressee") else ""
        ids = []
        for part in self.reply_texts(text):
            def deliver(part: str = part) -> str:
                msg = self.client.make_message(mto=conversation.chat_id, mbody=prefix + part, mtype=mtype)
                msg["chat_state"] = "active"
                msg.send()
                return msg["id"]
            ids.append(self._call(deliver))
        return ",".join(ids)

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        # XEP-0444 in direct chats (a room's reactions name the MUC's stanza id, which
        # agentd does not keep): each reactions message is the whole set, so it replaces.
        if conversation.direct:
            self._call(lambda: self.client.plugin["xep_0444"].send_reactions(
                conversation.chat_id, message_id, [emoji], store=True))

    def send_typing(self, conversation: Conversation) -> None:
        if conversation.direct:
            def composing() -> None:
                msg = self.client.make_message(mto=conversation.chat_id, mtype="chat")
                msg["chat_state"] = "composing"
                msg.send()
            self._call(composing)

    def close(self) -> None:
        if self.loop is not None and self.client is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._shutdown)

    def _shutdown(self) -> None:
        self.online = False
        self.client.cancel_connection_attempt()
        if self.client.transport is None:  # not connected: nothing to wait for
            self.loop.stop()
        else:
            self.client.disconnect(wait=1.0)  # the `disconnected` event stops the loop

    def health(self) -> bool:
        return self.online

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("allowed_users") or []), "")
        if not target:
            raise ChannelError("no test target: pass chat_id (a JID) or set allowed_users")
        return Conversation(self.name, target, target, direct=target not in self.rooms)


def drain(loop: asyncio.AbstractEventLoop) -> None:
    """Finish the loop's leftover tasks (slixmpp's send filters...) before closing it, so
    nothing touches the closed loop when slixmpp's objects are garbage-collected."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.close()


ADAPTER = XmppAdapter
