"""Nostr event crypto for the nostr adapter: keys (hex or NIP-19 `nsec`/`npub`, bech32),
event ids and BIP-340 Schnorr signatures (NIP-01), and NIP-04 direct-message encryption
(ECDH on secp256k1 -> the shared point's x coordinate as an AES-256-CBC key,
`<base64 ciphertext>?iv=<base64 iv>`). secp256k1 is `coincurve` (libsecp256k1);
AES is `cryptography`.

Docs: https://github.com/nostr-protocol/nips (01.md, 04.md, 19.md), BIP-173 (bech32).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from typing import Any

from coincurve import PrivateKey, PublicKey, PublicKeyXOnly
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"


def _polymod(values: list[int]) -> int:
    generator = [0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3]
    check = 1
    for value in values:
        top = check >> 25
        check = (check & 0x1FFFFFF) << 5 ^ value
        for i in range(5):
            check ^= generator[i] if (top >> i) & 1 else 0
    return check


def _hrp_expand(hrp: str) -> list[int]:
    return [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]


def _convert(data: list[int] | bytes, source: int, target: int, pad: bool) -> list[int]:
    acc = bits = 0
    out: list[int] = []
    for value in data:
        acc = (acc << source) | value
        bits += source
        while bits >= target:
            bits -= target
            out.append((acc >> bits) & ((1 << target) - 1))
    if pad and bits:
        out.append((acc << (target - bits)) & ((1 << target) - 1))
    elif not pad and (bits >= source or (acc << (target - bits)) & ((1 << target) - 1)):
        raise ValueError("invalid bech32 padding")
    return out


def bech32_encode(hrp: str, data: bytes) -> str:
    words = _convert(data, 8, 5, True)
    checksum = _polymod(_hrp_expand(hrp) + words + [0] * 6) ^ 1
    words += [(checksum >> 5 * (5 - i)) & 31 for i in range(6)]
    return hrp + "1" + "".join(_CHARSET[w] for w in words)


def bech32_decode(text: str) -> tuple[str, bytes]:
    text = text.strip().lower()
    hrp, sep, rest = text.rpartition("1")
    if not sep or not hrp or len(rest) < 6 or any(c not in _CHARSET for c in rest):
        raise ValueError("not a bech32 string")
    words = [_CHARSET.index(c) for c in rest]
    if _polymod(_hrp_expand(hrp) + words) != 1:
        raise ValueError("bad bech32 checksum")
    return hrp, bytes(_convert(words[:-6], 5, 8, False))


def private_key(value: str) -> bytes:
    """A 32-byte secret from 64 hex digits or an `nsec1...` string."""
    value = value.strip()
    if value.startswith("nsec1"):
        hrp, raw = bech32_decode(value)
    else:
        raw = bytes.fromhex(value) if len(value) == 64 else b""
    if len(raw) != 32:
        raise ValueError("a Nostr private key is 64 hex digits or an nsec1... string")
    PrivateKey(raw)  # rejects 0 and values >= the curve order
    return raw


def public_key(secret: bytes) -> str:
    """The x-only public key (hex) of a secret."""
    return PrivateKey(secret).public_key_xonly.format().hex()


def npub(pubkey_hex: str) -> str:
    return bech32_encode("npub", bytes.fromhex(pubkey_hex))


def event_id(event: dict[str, Any]) -> str:
    """sha256 of the canonical serialization `[0,pubkey,created_at,kind,tags,content]`."""
    data = [0, event["pubkey"], event["created_at"], event["kind"], event["tags"], event["content"]]
    return hashlib.sha256(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def sign_event(secret: bytes, kind: int, content: str, tags: list[list[str]]) -> dict[str, Any]:
    event: dict[str, Any] = {"pubkey": public_key(secret), "created_at": int(time.time()), "kind": kind,
                             "tags": tags, "content": content}
    event["id"] = event_id(event)
    event["sig"] = PrivateKey(secret).sign_schnorr(bytes.fromhex(event["id"])).hex()
    return event


def verify_event(event: Any) -> bool:
    """The id matches the content and the signature is the pubkey's (BIP-340)."""
    try:
        if not (isinstance(event["content"], str) and isinstance(event["tags"], list)
                and isinstance(event["kind"], int) and isinstance(event["created_at"], int)):
            return False
        if event_id(event) != event["id"]:
            return False
        key = PublicKeyXOnly(bytes.fromhex(event["pubkey"]))
        return bool(key.verify(bytes.fromhex(event["sig"]), bytes.fromhex(event["id"])))
    except (KeyError, TypeError, ValueError):
        return False


def _shared_key(secret: bytes, pubkey_hex: str) -> bytes:
    # NIP-04 uses the bare x coordinate of the ECDH point (not libsecp256k1's hashed ECDH).
    point = PublicKey(b"\x02" + bytes.fromhex(pubkey_hex)).multiply(secret)
    return point.format(compressed=True)[1:]


def nip04_encrypt(secret: bytes, pubkey_hex: str, text: str) -> str:
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    data = padder.update(text.encode("utf-8")) + padder.finalize()
    encryptor = Cipher(algorithms.AES(_shared_key(secret, pubkey_hex)), modes.CBC(iv)).encryptor()
    body = encryptor.update(data) + encryptor.finalize()
    return f"{base64.b64encode(body).decode()}?iv={base64.b64encode(iv).decode()}"


def nip04_decrypt(secret: bytes, pubkey_hex: str, content: str) -> str:
    body, sep, iv = content.partition("?iv=")
    if not sep:
        raise ValueError("not a NIP-04 payload")
    decryptor = Cipher(algorithms.AES(_shared_key(secret, pubkey_hex)),
                       modes.CBC(base64.b64decode(iv))).decryptor()
    data = decryptor.update(base64.b64decode(body)) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return (unpadder.update(data) + unpadder.finalize()).decode("utf-8")
