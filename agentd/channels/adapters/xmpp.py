"""XMPP (RFC 6120/6121) with `slixmpp`, run on its own asyncio event loop in the
adapter's thread (agentd itself stays synchronous). Logs in as `jid` (SCRAM; STARTTLS
required when `use_tls`, the default), answers direct chat messages and messages in the
MUC `rooms` (XEP-0045) addressed to its nickname ("nick: ..."); room history replayed
on join is skipped. Typing uses chat states (XEP-0085). After a lost connection it logs
in again with backoff; stop() disconnects and ends the loop."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import slixmpp

from agentd.channels.adapter import Adapter, ChannelError, Conversation, Inbound
from agentd.retry import Backoff


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

    def start(self) -> None:
        if "@" not in self.jid:
            raise ChannelError("jid (like bot@example.org) is not set")
        self.password = self.env("password_env")
        self.loop = asyncio.new_event_loop()
        self.spawn(self._run, "loop")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        client = slixmpp.ClientXMPP(self.jid, self.password)
        for plugin in ("xep_0030", "xep_0045", "xep_0085", "xep_0199", "xep_0203", "xep_0444"):
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
        self.online = True
        if self.failing:
            self.ctx.audit("reconnected")
        self.failing = False
        self.backoff.reset()

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
        conversation = Conversation(self.name, sender, sender, direct=True)
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=msg["body"], message_id=msg["id"] or "",
                                 sender_name=msg["from"].user, mentioned=self.nick.lower() in msg["body"].lower()))

    def _groupchat(self, msg: Any) -> None:
        nick, body = msg["mucnick"], msg["body"] or ""
        if nick == self.nick or msg["delay"]["stamp"] or msg["subject"]:
            return  # our own echo, replayed history, topic changes
        for mark in (":", ",", " "):
            if body.lower().startswith(self.nick.lower() + mark):
                break
        else:
            return  # room chatter not addressed to us
        room = msg["from"].bare
        real = self.client.plugin["xep_0045"].get_jid_property(room, nick, "jid")
        sender = str(real.bare) if real else f"{room}/{nick}"
        conversation = Conversation(self.name, room, sender, meta={"addressee": nick})
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=body[len(self.nick) + 1:].strip(),
                                 message_id=msg["id"] or "", sender_name=nick, sender_aliases=(nick,),
                                 mentioned=True))  # room messages reach the agent only when addressed

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
