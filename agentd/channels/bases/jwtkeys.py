"""Verifying a platform's RS256 JWT (Bot Framework, Google Chat) against its published
keys: an OpenID configuration naming a `jwks_uri`, a JWKS document, or Google's map of
X.509 certificates. Keys are cached and refetched when a token names an unknown key
id (at most once per `refetch_secs`, 10 s), so a platform's key rotation is picked up
while a flood of made-up key ids costs one fetch per window."""

from __future__ import annotations

import threading
import time
from typing import Any

import jwt
from cryptography import x509

from agentd.channels.adapter import ChannelError
from agentd.channels.bases.sender import HttpSender


class KeySet:
    """Public keys by `kid` from `url`; `kind` is "openid", "jwks" or "x509"."""

    def __init__(self, http: HttpSender, url: str, kind: str = "jwks", refetch_secs: float = 10.0) -> None:
        self.http, self.url, self.kind = http, url, kind
        self.refetch_secs = refetch_secs
        self._keys: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._fetched = -1e9
        self._lock = threading.Lock()

    def key(self, kid: str) -> tuple[Any, dict[str, Any]]:
        """(public key, its JWK fields) for `kid`; ChannelError when unknown."""
        with self._lock:
            if kid not in self._keys and time.monotonic() - self._fetched >= self.refetch_secs:
                self._fetched = time.monotonic()
                try:
                    self._keys = self._load()
                except ChannelError:
                    # The key endpoint is down: try again in a few seconds, not a minute.
                    self._fetched -= max(self.refetch_secs - 2.0, 0.0)
                    raise
            found = self._keys.get(kid)
        if found is None:
            raise ChannelError(f"no signing key {kid!r} at {self.url}")
        return found

    def _load(self) -> dict[str, tuple[Any, dict[str, Any]]]:
        url = self.url
        if self.kind == "openid":
            config = self.http.json("GET", url, retries=1)
            url = config.get("jwks_uri") if isinstance(config, dict) else None
            if not isinstance(url, str) or not url:
                raise ChannelError(f"{self.url}: no jwks_uri in the OpenID configuration")
        document = self.http.json("GET", url, retries=1)
        keys: dict[str, tuple[Any, dict[str, Any]]] = {}
        if self.kind == "x509":  # {"<kid>": "-----BEGIN CERTIFICATE-----..."}
            for kid, pem in (document or {}).items():
                cert = x509.load_pem_x509_certificate(str(pem).encode("ascii"))
                keys[kid] = (cert.public_key(), {"kid": kid})
            return keys
        for item in (document or {}).get("keys") or []:
            if isinstance(item, dict) and item.get("kid") and item.get("kty") == "RSA":
                keys[item["kid"]] = (jwt.PyJWK(item, algorithm="RS256").key, item)
        return keys


def verify_jwt(token: str, keys: KeySet, issuer: str, audience: str,
               leeway: float = 300.0) -> tuple[dict[str, Any], dict[str, Any]]:
    """(claims, the signing key's JWK fields) of an RS256 `token` signed by one of `keys`,
    issued by `issuer` for `audience`, not expired (`leeway` seconds of clock skew).
    Raises ChannelError."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise ChannelError(f"malformed token: {exc}") from None
    if header.get("alg") != "RS256":  # never "none", never an HMAC keyed with a public key
        raise ChannelError(f"token algorithm {header.get('alg')!r} is not RS256")
    public_key, jwk = keys.key(str(header.get("kid") or ""))
    try:
        return jwt.decode(token, public_key, algorithms=["RS256"], audience=audience, issuer=issuer,
                          leeway=leeway, options={"require": ["exp", "iss", "aud"]}), jwk
    except jwt.PyJWTError as exc:
        raise ChannelError(f"token refused: {exc}") from None


def bearer(headers: dict[str, str]) -> str:
    """The token of an `Authorization: Bearer <token>` header ("" when absent)."""
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def key_endorses(jwk: dict[str, Any], channel_id: str) -> bool:
    """Bot Framework keys list the channels they may sign for (`endorsements`)."""
    endorsements = jwk.get("endorsements")
    return not isinstance(endorsements, list) or channel_id in endorsements

