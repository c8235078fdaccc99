"""A fake Nostr relay (NIP-01, https://github.com/nostr-protocol/nips/blob/master/01.md) on
a WebSocket at `/`: `REQ` (filters: ids, authors, kinds, #e/#p tags, since, until,
limit) answered with the stored matches, `EOSE`, then live events; `EVENT` checked like a
relay does (the id is the sha256 of `[0,pubkey,created_at,kind,tags,content]`, the sig a
BIP-340 Schnorr signature by pubkey) and answered `OK`; `CLOSE`. While `throttle` holds
entries, the bot's next EVENTs get `OK false "rate-limited: ..."`. A kind-5 deletion (NIP-09)
removes the events it names that its author published (`deleted` holds them); kind-7
reactions (NIP-25) are stored like any event and are not replies.

Test users have deterministic keys (`user_secret(name)`); their direct messages are
NIP-04 encrypted here, independently of the adapter (ECDH x coordinate, AES-256-CBC).
Follows FakePlatform's contract (`sent`, `throttle`, `polls`, `restart`)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import queue
import threading
import time
from typing import Any

from coincurve import PrivateKey, PublicKey, PublicKeyXOnly
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from flask_sock import Sock
from simple_websocket import ConnectionClosed

from fakes.platform import FakePlatform


def user_secret(name: str) -> bytes:
    return hashlib.sha256(f"nostr test user {name}".encode()).digest()


def pubkey_of(secret: bytes) -> str:
    return PrivateKey(secret).public_key_xonly.format().hex()


def user_pubkey(name: str) -> str:
    return pubkey_of(user_secret(name))


def serialize(event: dict[str, Any]) -> bytes:
    return json.dumps([0, event["pubkey"], event["created_at"], event["kind"], event["tags"], event["content"]],
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def signed(secret: bytes, kind: int, content: str, tags: list[list[str]], created_at: int | None = None) -> dict:
    event = {"pubkey": pubkey_of(secret), "created_at": created_at or int(time.time()), "kind": kind,
             "tags": tags, "content": content}
    event["id"] = hashlib.sha256(serialize(event)).hexdigest()
    event["sig"] = PrivateKey(secret).sign_schnorr(bytes.fromhex(event["id"])).hex()
    return event


def valid(event: dict[str, Any]) -> bool:
    try:
        if hashlib.sha256(serialize(event)).hexdigest() != event["id"]:
            return False
        return PublicKeyXOnly(bytes.fromhex(event["pubkey"])).verify(bytes.fromhex(event["sig"]),
                                                                     bytes.fromhex(event["id"]))
    except (KeyError, ValueError, TypeError):
        return False


def _aes_key(secret: bytes, pubkey: str) -> bytes:
    return PublicKey(bytes.fromhex("02" + pubkey)).multiply(secret).format()[1:]


def encrypt(secret: bytes, pubkey: str, text: str) -> str:
    iv = os.urandom(16)
    raw = text.encode()
    raw += bytes([16 - len(raw) % 16]) * (16 - len(raw) % 16)  # PKCS#7
    enc = Cipher(algorithms.AES(_aes_key(secret, pubkey)), modes.CBC(iv)).encryptor()
    return base64.b64encode(enc.update(raw) + enc.finalize()).decode() + "?iv=" + base64.b64encode(iv).decode()


def decrypt(secret: bytes, pubkey: str, content: str) -> str:
    body, _, iv = content.partition("?iv=")
    dec = Cipher(algorithms.AES(_aes_key(secret, pubkey)), modes.CBC(base64.b64decode(iv))).decryptor()
    raw = dec.update(base64.b64decode(body)) + dec.finalize()
    return raw[:-raw[-1]].decode()


def matches(event: dict[str, Any], flt: dict[str, Any]) -> bool:
    for key, field in (("ids", "id"), ("authors", "pubkey"), ("kinds", "kind")):
        if key in flt and event[field] not in flt[key]:
            return False
    if "since" in flt and event["created_at"] < flt["since"]:
        return False
    if "until" in flt and event["created_at"] > flt["until"]:
        return False
    for key, wanted in flt.items():
        if key.startswith("#") and not any(t[0] == key[1:] and t[1] in wanted for t in event["tags"] if len(t) > 1):
            return False
    return True


class FakeRelay(FakePlatform):
    def __init__(self, bot_pubkey: str) -> None:
        super().__init__("nostr")
        self.bot = bot_pubkey
        self.events: list[dict[str, Any]] = []
        self.rejected: list[tuple[str, str]] = []
        self.deleted: list[dict[str, Any]] = []
        self.subs: list[tuple[dict[str, list[dict]], "queue.Queue[str]"]] = []
        self.relay_lock = threading.Lock()
        sock = Sock(self.app)

        @sock.route("/")
        def relay(ws):
            self.serve(ws)

    def serve(self, ws: Any) -> None:
        subs: dict[str, list[dict]] = {}
        outbox: "queue.Queue[str]" = queue.Queue()
        with self.relay_lock:
            self.subs.append((subs, outbox))
        try:
            while True:
                frame = ws.receive(timeout=0.05)
                if frame is not None:
                    self.on_frame(json.loads(frame), subs, outbox)
                while not outbox.empty():
                    ws.send(outbox.get_nowait())
        except (ConnectionClosed, OSError, ValueError):
            return
        finally:
            with self.relay_lock:
                self.subs.remove((subs, outbox))

    def on_frame(self, msg: list, subs: dict, outbox: "queue.Queue[str]") -> None:
        if msg[0] == "REQ":
            self.polled()
            subs[msg[1]] = msg[2:]
            with self.relay_lock:
                stored = list(self.events)
            for event in stored:
                if any(matches(event, f) for f in msg[2:]):
                    outbox.put(json.dumps(["EVENT", msg[1], event]))
            outbox.put(json.dumps(["EOSE", msg[1]]))
        elif msg[0] == "CLOSE":
            subs.pop(msg[1], None)
        elif msg[0] == "EVENT":
            event = msg[1]
            if event.get("pubkey") == self.bot and self.throttle:
                self.throttle.pop(0)
                outbox.put(json.dumps(["OK", event.get("id"), False, "rate-limited: slow down there chief"]))
            elif not valid(event):
                self.rejected.append((str(event.get("id")), "invalid: bad signature"))
                outbox.put(json.dumps(["OK", event.get("id"), False, "invalid: event id or signature is wrong"]))
            else:
                if event["kind"] == 5:
                    named = {t[1] for t in event["tags"] if len(t) > 1 and t[0] == "e"}
                    with self.relay_lock:
                        gone = [e for e in self.events if e["id"] in named and e["pubkey"] == event["pubkey"]]
                        self.events = [e for e in self.events if e not in gone]
                        self.deleted.extend(gone)
                self.publish(event)
                outbox.put(json.dumps(["OK", event["id"], True, ""]))
                if event["pubkey"] == self.bot:
                    self.record(**event)

    def publish(self, event: dict[str, Any]) -> None:
        """Store an event and send it to every matching subscription."""
        with self.relay_lock:
            if any(e["id"] == event["id"] for e in self.events):
                return
            self.events.append(event)
            for subs, outbox in self.subs:
                for sub_id, filters in list(subs.items()):
                    if any(matches(event, f) for f in filters):
                        outbox.put(json.dumps(["EVENT", sub_id, event]))

    def dm(self, user: str, text: str) -> dict[str, Any]:
        """A kind-4 DM from `user` to the bot (not yet published)."""
        secret = user_secret(user)
        return signed(secret, 4, encrypt(secret, self.bot, text), [["p", self.bot]])

    def user_says(self, user: str, text: str) -> str:
        self.publish(self.dm(user, text))
        return user_pubkey(user)

    def replies(self, pubkey: str) -> list[str]:
        """What the bot said to `pubkey`: DMs decrypted with the user's key, notes as is."""
        name = next((n for n in ("ann", "bob", "mallory", "carol") if user_pubkey(n) == pubkey), "")
        out = []
        for event in self.sent:
            if ["p", pubkey] not in [t[:2] for t in event["tags"]] or event["kind"] not in (1, 4):
                continue
            out.append(decrypt(user_secret(name), self.bot, event["content"]) if event["kind"] == 4
                       else event["content"])
        return out
