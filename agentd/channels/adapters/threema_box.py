"""Threema Gateway wire helpers: the callback MAC, the E2E message container's padding,
key parsing and the form-encoded callback body (https://gateway.threema.ch/en/developer/e2e)."""

from __future__ import annotations

import secrets
from urllib.parse import parse_qs

CALLBACK_FIELDS = ("from", "to", "messageId", "date", "nonce", "box")


def callback_data(form: dict[str, str]) -> str:
    """What the `mac` of an incoming-message callback signs (hex HMAC-SHA256, API secret)."""
    return "".join(form.get(name, "") for name in CALLBACK_FIELDS)


def pad(data: bytes) -> bytes:
    """Random PKCS#7-style padding of 1..255 bytes, at least 32 bytes in all (Threema E2E)."""
    length = secrets.randbelow(255) + 1
    length = max(length, 32 - len(data))
    return data + bytes([length]) * length


def unpad(data: bytes) -> bytes:
    """The container without its padding (the last byte says how many bytes to drop)."""
    if not data or data[-1] == 0 or data[-1] > len(data):
        raise ValueError("bad padding")
    return data[:-data[-1]]


def parse_key(value: str) -> bytes:
    """A 32-byte key as Threema tools print it: hex, optionally `private:`/`public:` prefixed."""
    raw = bytes.fromhex(value.strip().split(":", 1)[-1])
    if len(raw) != 32:
        raise ValueError("a key is 32 bytes (64 hex digits)")
    return raw


def parse_form(body: bytes) -> dict[str, str]:
    """The first value of each field of a form-encoded body ({} when not ASCII)."""
    try:
        pairs = parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        return {}
    return {name: values[0] for name, values in pairs.items()}
