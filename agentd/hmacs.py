"""HMAC signatures and secret comparison: the webhook verifiers of the channel adapters,
the dashboard's session and CSRF keys, API key checks. Every comparison of something a
client presents with a secret (or a value derived from one) goes through `same()`, which
takes the same time however much of it matches. Only the standard library: any layer
may use it."""

from __future__ import annotations

import base64
import hmac


def _bytes(value: str | bytes) -> bytes:
    # surrogatepass: a header or form value that is not valid text still compares as
    # itself (never equal to a different value, never an exception).
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")


def digest(key: str | bytes, message: str | bytes, algorithm: str = "sha256") -> bytes:
    """HMAC-`algorithm` of `message` under `key` (text is UTF-8)."""
    return hmac.new(_bytes(key), _bytes(message), algorithm).digest()


def hex_digest(key: str | bytes, message: str | bytes, algorithm: str = "sha256") -> str:
    return digest(key, message, algorithm).hex()


def b64_digest(key: str | bytes, message: str | bytes, algorithm: str = "sha256") -> str:
    return base64.b64encode(digest(key, message, algorithm)).decode("ascii")


def same(given: str | bytes | None, expected: str | bytes) -> bool:
    """Constant-time equality of a presented value and the expected one. Nothing presented
    (None or empty) never matches, whatever is expected."""
    if not given:
        return False
    return hmac.compare_digest(_bytes(given), _bytes(expected))


def check(key: str | bytes | None, message: str | bytes, given: str | None, *, algorithm: str = "sha256",
          encoding: str = "hex", prefix: str = "") -> bool:
    """Whether `given` is `prefix` followed by the HMAC of `message` under `key`, as hex
    (either case) or base64. Surrounding whitespace is ignored; no key or nothing given is
    False."""
    if not key or not given:
        return False
    given = given.strip()
    if not given.startswith(prefix):
        return False
    signature = given[len(prefix):]
    raw = digest(key, message, algorithm)
    if encoding == "hex":
        return same(signature.lower(), raw.hex())
    if encoding == "base64":
        return same(signature, base64.b64encode(raw))
    raise ValueError(f"unknown signature encoding {encoding!r}")
