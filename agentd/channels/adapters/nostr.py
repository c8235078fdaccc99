"""Nostr (NIP-01) over every relay in `relays`, one WebSocket each (reconnecting on its
own): a subscription for encrypted direct messages (kind 4, NIP-04) and notes mentioning
the bot (kind 1, tag `p` = our key) since the last one seen (first start: now). Inbound
events whose id or BIP-340 signature does not check out are dropped and audited; an event
delivered by several relays is answered once. Replies are signed events published to every
connected relay: a kind-4 DM back, or a kind-1 reply with NIP-10 `e`/`p` tags; delivery
counts when a relay answers `OK true`, and `rate-limited:` refusals are retried after 1, 2,
4 s. Keys: `private_key_env` holds 64 hex digits or an `nsec1...` string.

Reactions (`lifecycle_reactions`): a kind-7 event (NIP-25) on a note that mentioned the bot,
taken back with a kind-5 deletion (NIP-09). Never on a direct message: a reaction is public
and would tell everyone who wrote to the bot.

Docs: https://github.com/nostr-protocol/nips (01, 04, 09, 10, 19, 25, 27).
"""

from __future__ import annotations

import collections
import re
import threading
import time
import uuid
from typing import Any

from agentd.channels.adapter import Adapter, ChannelError, Conversation, Inbound
from agentd.channels.adapters import nostr_crypto as nc
from agentd.channels.bases.websocket import WebSocketAdapter

OK_TIMEOUT = 10.0  # seconds to wait for relays' OK to a published event
REACTIONS_KEPT = 1000  # reaction event ids remembered to take a reaction back


class _Relay(WebSocketAdapter):
    """One relay connection; events and OKs go to the owning NostrAdapter."""

    heartbeat = 30.0

    def __init__(self, owner: "NostrAdapter", url: str) -> None:
        super().__init__(owner.ctx, owner.settings)
        self.owner, self.url = owner, url

    def ws_url(self) -> str:
        return self.url

    def on_open(self) -> None:
        since = int(self.owner.state.get("since") or self.owner.floor)
        mine = {"#p": [self.owner.pubkey], "since": since}
        self.ws_send(["REQ", self.owner.sub_id, {"kinds": [4], **mine}, {"kinds": [1], **mine}])

    def on_message(self, data: Any) -> None:
        if not isinstance(data, list) or not data:
            return
        if data[0] == "EVENT" and len(data) >= 3 and isinstance(data[2], dict):
            self.owner.on_event(data[2])
        elif data[0] == "OK" and len(data) >= 4:
            self.owner.on_ok(self.url, str(data[1]), bool(data[2]), str(data[3]))
        elif data[0] in ("NOTICE", "CLOSED"):
            self.ctx.log.info("relay %s: %s", self.url, data[1:])

    def publish(self, event: dict[str, Any]) -> bool:
        if self.ws is None or not self.healthy:
            return False
        self.ws_send(["EVENT", event])
        return True


class NostrAdapter(Adapter):
    max_message_len = 4000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.state: dict[str, Any] = ctx.load_state()
        self.started = int(time.time())
        self.sub_id = "agentd-" + uuid.uuid4().hex[:8]
        self.seen: collections.deque[str] = collections.deque(self.state.get("ids") or [], maxlen=2000)
        self.floor = int(self.state.get("since") or self.started)
        self.lock = threading.Condition()
        self.oks: dict[str, dict[str, tuple[bool, str]]] = {}
        self.relays: list[_Relay] = []
        # (note id, emoji) -> the bot's reaction event id, for the deletion that takes it back.
        self.reactions: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()

    def _keys(self) -> None:
        try:
            self.secret = nc.private_key(self.env("private_key_env"))
        except ValueError as exc:
            raise ChannelError(f"{self.settings.get('private_key_env')}: {exc}") from None
        self.pubkey = nc.public_key(self.secret)

    def start(self) -> None:
        self._keys()
        urls = [str(u) for u in self.settings.get("relays") or []]
        if not urls or any(not re.match(r"^wss?://", u) for u in urls):
            raise ChannelError("relays must list relay URLs (wss://...)")
        self.relays = [_Relay(self, url) for url in urls]
        for relay in self.relays:
            relay.start()

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        with self.lock:
            self.lock.notify_all()  # a send waiting for relays' OKs gives up now
        for relay in self.relays:
            relay.stop(timeout)

    def health(self) -> bool:
        return any(relay.health() for relay in self.relays)

    def threads_alive(self) -> int:
        return super().threads_alive() + sum(relay.threads_alive() for relay in self.relays)

    # -- inbound ----------------------------------------------------------------------
    def on_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            if event.get("id") in self.seen:
                return  # another relay delivered it first
            if not nc.verify_event(event):
                self.ctx.audit("refused", reason="bad signature", sender=str(event.get("pubkey"))[:64],
                               message_id=str(event.get("id"))[:64])
                return
            self.seen.append(event["id"])
            if event["created_at"] < self.floor:
                return  # from before our cursor: relays that ignore `since` resend history
            self._advance(event["created_at"], event["id"])
        author, kind, tags = event["pubkey"], event["kind"], [t for t in event["tags"] if isinstance(t, list)]
        if author == self.pubkey or ["p", self.pubkey] not in [t[:2] for t in tags]:
            return
        if kind == 4:
            try:
                text = nc.nip04_decrypt(self.secret, author, event["content"])
            except Exception:  # noqa: BLE001 - a bad payload must never break the relay reader
                self.ctx.log.info("undecryptable DM %s", event["id"])
                return
            meta: dict[str, Any] = {"kind": 4}
        elif kind == 1:
            # NIP-27 references to us (`nostr:npub1...`) are the mention, not the message.
            text = re.sub(r"(?:nostr:)?" + nc.npub(self.pubkey), "", event["content"])
            roots = [t[1] for t in tags if len(t) > 3 and t[0] == "e" and t[3] == "root"]
            meta = {"kind": 1, "reply_to": event["id"], "root": roots[0] if roots else event["id"]}
        else:
            return
        if text.strip():
            conversation = Conversation(self.name, author, author, direct=True, meta=meta)
            self.ctx.deliver(Inbound(conversation, sender_id=author, text=text.strip(), message_id=event["id"],
                                     sender_aliases=(nc.npub(author),)))

    def _advance(self, created_at: int, event_id: str) -> None:
        """Persist the cursor: the newest timestamp and the ids seen at that second, so a
        restart subscribes `since` it (inclusive) without answering those ids again."""
        since = int(self.state.get("since") or 0)
        if created_at > since:
            self.state.update(since=created_at, ids=[event_id])
        elif created_at == since:
            self.state["ids"] = (list(self.state.get("ids") or []) + [event_id])[-50:]
        else:
            return
        self.ctx.save_state(dict(self.state))

    def on_ok(self, relay: str, event_id: str, accepted: bool, message: str) -> None:
        with self.lock:
            if event_id in self.oks:
                self.oks[event_id][relay] = (accepted, message)
                self.lock.notify_all()

    # -- outbound ---------------------------------------------------------------------
    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "secret"):
            self._keys()
        ids = []
        for part in self.reply_texts(text):
            if conversation.meta.get("kind") == 1:
                root, reply = conversation.meta["root"], conversation.meta["reply_to"]
                tags = [["e", root, "", "root"]] + ([["e", reply, "", "reply"]] if reply != root else [])
                event = nc.sign_event(self.secret, 1, part, tags + [["p", conversation.chat_id]])
            else:
                event = nc.sign_event(self.secret, 4, nc.nip04_encrypt(self.secret, conversation.chat_id, part),
                                      [["p", conversation.chat_id]])
            ids.append(self._publish(event))
        return ",".join(ids)

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        if conversation.meta.get("kind") != 1:
            return  # a direct message: see the module doc
        if not hasattr(self, "secret"):
            self._keys()
        event = nc.sign_event(self.secret, 7, emoji, [["e", message_id], ["p", conversation.chat_id], ["k", "1"]])
        self._publish(event, attempts=1)  # cosmetic: never worth holding the answer back
        with self.lock:
            self.reactions[(message_id, emoji)] = event["id"]
            while len(self.reactions) > REACTIONS_KEPT:
                self.reactions.popitem(last=False)

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        with self.lock:
            reaction = self.reactions.pop((message_id, emoji), "")
        if reaction:
            self._publish(nc.sign_event(self.secret, 5, "", [["e", reaction], ["k", "7"]]), attempts=1)

    def _publish(self, event: dict[str, Any], attempts: int = 4) -> str:
        for attempt in range(attempts):
            with self.lock:
                self.oks[event["id"]] = {}
            sent_to = [r.url for r in self.relays if r.publish(event)]
            if not sent_to:
                raise ChannelError("no relay is connected")
            with self.lock:
                answers = self.oks[event["id"]]
                # Done when one relay accepted it or every relay it went to has answered.
                self.lock.wait_for(lambda: self.stopping.is_set() or len(answers) >= len(sent_to)
                                   or any(ok for ok, _ in answers.values()), timeout=OK_TIMEOUT)
                self.oks.pop(event["id"], None)
            if any(ok for ok, _ in answers.values()):
                return event["id"]
            messages = [m for _, m in answers.values()]
            if (not any(m.startswith("rate-limited:") for m in messages) or attempt + 1 >= attempts
                    or self.stopping.wait(2.0 ** attempt)):
                raise ChannelError(f"no relay accepted the event: {messages or 'no answer'}")
        raise ChannelError("relays kept rate-limiting the event")

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a public key: npub1... or hex) to send a test DM")
        key = nc.bech32_decode(override)[1].hex() if override.startswith("npub1") else override.lower()
        if not re.fullmatch(r"[0-9a-f]{64}", key):
            raise ChannelError("chat_id must be an npub1... or 64-hex public key")
        return Conversation(self.name, key, key, direct=True, meta={"kind": 4})


ADAPTER = NostrAdapter
