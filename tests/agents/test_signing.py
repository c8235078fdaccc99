"""Signed manifest envelopes in process: every check with its exact 403 message, near-miss
keys, signatures and byte arrays. tests/agents/test_agents.py::test_signed_manifest covers POST /api/agents.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from nacl.signing import SigningKey

from agentd.agents.signing import SignatureError, sign_manifest, verify_envelope
from agentd.errors import Forbidden

TEXT = 'name = "signed"\n'
SEED = bytes(range(32))


def envelope(text: str = TEXT, **changes) -> dict:
    env = json.loads(sign_manifest(text, SigningKey(SEED), "tester"))
    env.update(changes)
    return env


def refused(env, manifest_toml=None) -> str:
    text = env if isinstance(env, str) or env is None else json.dumps(env)
    with pytest.raises(SignatureError) as info:
        verify_envelope(text, manifest_toml)
    assert isinstance(info.value, Forbidden) and info.value.status == 403
    prefix = "manifest signature verification failed: "
    assert info.value.message.startswith(prefix)
    return info.value.message[len(prefix):]


def test_sign_manifest_builds_the_exact_envelope() -> None:
    key = SigningKey(SEED)
    env = json.loads(sign_manifest(TEXT, key, "tester"))
    digest = hashlib.sha256(TEXT.encode("utf-8")).hexdigest()
    assert list(env) == ["manifest", "content_hash", "signature", "signer_public_key", "signer_id"]
    assert env["manifest"] == TEXT and env["content_hash"] == digest and env["signer_id"] == "tester"
    assert env["signer_public_key"] == list(bytes(key.verify_key))
    # The signed message is the ASCII hex text of the hash, not its 32 raw bytes.
    assert bytes(env["signature"]) == key.sign(digest.encode("ascii")).signature
    assert json.loads(sign_manifest(TEXT, key))["signer_id"] == ""


def test_a_good_envelope_returns_its_manifest() -> None:
    text = 'name = "ünïcode"\n'
    env = envelope(text)
    assert verify_envelope(json.dumps(env), None) == text
    assert verify_envelope(json.dumps(env), "") == text, "an empty manifest_toml is not compared"
    assert verify_envelope(json.dumps(env), "   \n") == text
    assert verify_envelope(json.dumps(env), "\n  " + text + "  \n") == text, "the comparison is trimmed"


def test_hex_byte_fields_are_accepted() -> None:
    env = envelope()
    env["signature"] = bytes(env["signature"]).hex()
    env["signer_public_key"] = bytes(env["signer_public_key"]).hex().upper()
    assert verify_envelope(json.dumps(env), TEXT) == TEXT


@pytest.mark.parametrize("text", ["{nope", "", "null", "[1, 2]", '"text"', "42"])
def test_not_an_envelope(text: str) -> None:
    expected = "signed_manifest is not valid JSON" if text in ("{nope", "") else "envelope has no manifest text"
    assert refused(text) == expected


def test_not_a_string_at_all() -> None:
    assert refused(None) == "signed_manifest is not valid JSON"


@pytest.mark.parametrize("manifest", [None, 5, ["name"], {"t": 1}])
def test_manifest_must_be_text(manifest) -> None:
    env = envelope()
    env["manifest"] = manifest
    assert refused(env) == "envelope has no manifest text"
    del env["manifest"]
    assert refused(env) == "envelope has no manifest text"


def test_content_hash_must_match_exactly() -> None:
    digest = hashlib.sha256(TEXT.encode()).hexdigest()
    for wrong in (digest.upper(), digest[:-1], digest + "0", None, hashlib.sha256(b"other").hexdigest()):
        assert refused(envelope(content_hash=wrong)) == "content hash mismatch", wrong
    tampered = envelope()
    tampered["manifest"] = TEXT.replace("signed", "evil")
    assert refused(tampered) == "content hash mismatch"


def test_forged_or_foreign_signatures() -> None:
    env = envelope()
    env["signature"][0] ^= 1
    assert refused(env) == "bad signature"
    other = SigningKey(bytes(32))
    env = envelope(signer_public_key=list(bytes(other.verify_key)))
    assert refused(env) == "bad signature", "BUG: a signature must be checked against the named key"
    digest = hashlib.sha256(TEXT.encode()).digest()
    env = envelope(signature=list(SigningKey(SEED).sign(digest).signature))
    assert refused(env) == "bad signature", "BUG: the signed message is the hex text of the hash"


@pytest.mark.parametrize("field, length", [("signer_public_key", 32), ("signature", 64)])
def test_byte_fields_near_misses(field: str, length: int) -> None:
    good = envelope()[field]
    assert refused(envelope(**{field: good[:-1]})) == f"{field} must be {length} bytes, got {length - 1}"
    assert refused(envelope(**{field: good + [0]})) == f"{field} must be {length} bytes, got {length + 1}"
    assert refused(envelope(**{field: bytes(good).hex()[:-2]})) == f"{field} must be {length} bytes, got {length - 1}"
    assert refused(envelope(**{field: "zz" * length})) == f"{field} is not hex"
    assert refused(envelope(**{field: "abc"})) == f"{field} is not hex"
    for bad in (good[:-1] + [256], good[:-1] + [-1], good[:-1] + ["7"], good[:-1] + [1.0], None, 7, {"a": 1}):
        assert refused(envelope(**{field: bad})) == f"{field} must be an array of byte values", bad
    at_edges = envelope(**{field: [0] * (length - 1) + [255]})
    assert refused(at_edges) == "bad signature", "BUG: 0 and 255 are byte values"
    missing = envelope()
    del missing[field]
    assert refused(missing) == f"{field} must be an array of byte values"


def test_manifest_toml_must_match_the_signed_one() -> None:
    assert refused(envelope(), 'name = "other"\n') == "signed manifest does not match manifest_toml"
    assert refused(envelope(), TEXT.strip() + "x") == "signed manifest does not match manifest_toml"
