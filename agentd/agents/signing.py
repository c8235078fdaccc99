"""Ed25519-signed manifest envelopes (pynacl).

Envelope (a JSON string):
  {"manifest": "<TOML text>",
   "content_hash": "<lowercase hex SHA-256 of the manifest's UTF-8 bytes>",
   "signature": <64 bytes>, "signer_public_key": <32 bytes>, "signer_id": "<free text>"}
Byte fields are JSON arrays of integers 0-255 (hex strings are accepted too).
The signed message is the ASCII text of `content_hash`.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pynacl loads on first use: most daemons never verify a signature
    from nacl.signing import SigningKey

from agentd import jsonsafe
from agentd.errors import Forbidden


class SignatureError(Forbidden):
    """Any failed check gives 403 with a message saying which check failed."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"manifest signature verification failed: {detail}")


def _bytes(value: Any, length: int, name: str) -> bytes:
    if isinstance(value, str):
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise SignatureError(f"{name} is not hex") from None
    elif isinstance(value, list) and all(isinstance(b, int) and 0 <= b <= 255 for b in value):
        raw = bytes(value)
    else:
        raise SignatureError(f"{name} must be an array of byte values")
    if len(raw) != length:
        raise SignatureError(f"{name} must be {length} bytes, got {len(raw)}")
    return raw


def verify_envelope(envelope_text: str, manifest_toml: str | None) -> str:
    """Check the envelope and return the manifest it vouches for.

    When `manifest_toml` is given it must match the signed manifest (trimmed).
    """
    try:  # (anything but a text is no JSON text: "" fails as one)
        envelope = jsonsafe.loads(envelope_text if isinstance(envelope_text, str) else "")
    except ValueError:
        raise SignatureError("signed_manifest is not valid JSON") from None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("manifest"), str):
        raise SignatureError("envelope has no manifest text")
    manifest = envelope["manifest"]
    # str.encode() is UTF-8; the hex digest is ASCII, which UTF-8 encodes byte for byte.
    digest = hashlib.sha256(manifest.encode()).hexdigest()
    if envelope.get("content_hash") != digest:
        raise SignatureError("content hash mismatch")
    key = _bytes(envelope.get("signer_public_key"), 32, "signer_public_key")
    signature = _bytes(envelope.get("signature"), 64, "signature")
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    # `_bytes` checked both lengths, so pynacl has no size error left to raise.
    try:
        VerifyKey(key).verify(digest.encode(), signature)
    except BadSignatureError:
        raise SignatureError("bad signature") from None
    if manifest_toml is not None and manifest_toml.strip() and manifest_toml.strip() != manifest.strip():
        raise SignatureError("signed manifest does not match manifest_toml")
    return manifest


def sign_manifest(manifest: str, signing_key: SigningKey, signer_id: str = "") -> str:
    """Build an envelope (used by scripts/sign_manifest.py and tests)."""
    digest = hashlib.sha256(manifest.encode()).hexdigest()
    signature = signing_key.sign(digest.encode()).signature
    return json.dumps({"manifest": manifest, "content_hash": digest,
                       "signature": list(signature),
                       "signer_public_key": list(bytes(signing_key.verify_key)),
                       "signer_id": signer_id})
