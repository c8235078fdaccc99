"""Verifying a platform's RS256 JWT (Bot Framework, Google Chat) against its published
keys: an OpenID configuration naming a `jwks_uri`, a JWKS document, or Google's map of
X.509 certificates. PyJWT's `PyJWKClient` caches the keys and refetches them when a token
names an unknown key id (at most once per `refetch_secs`, 10 s), so a platform's key
rotation is picked up while a flood of made-up key ids costs one fetch per window; the
documents are fetched here (through the adapter's sender), the OpenID configuration
followed to its `jwks_uri` and an X.509 map turned into a JWKS."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from jwt.algorithms import RSAAlgorithm

from agentd.channels.adapter import ChannelError
from agentd.channels.bases.sender import HttpSender

# After a failed fetch, the next one waits this long (a key endpoint that is down is not
# asked again for every request that arrives meanwhile).
RETRY_FAILED_SECS = 2.0


class KeySet(jwt.PyJWKClient):
    """Public keys by `kid` from `url`; `kind` is "openid", "jwks" or "x509"."""

    def __init__(self, http: HttpSender, url: str, kind: str = "jwks", refetch_secs: float = 10.0) -> None:
        # Keys stay until a token names one they lack: a platform's rotation brings new
        # kids; no timer needs to refetch (and a key endpoint down then costs nothing).
        # PyJWKClient's own refetch cooldown only sees its own fetches: the window is
        # kept in fetch_data instead.
        super().__init__("https://keys.invalid/", lifespan=math.inf, cooldown_duration=0)
        self.http, self.url, self.kind, self.refetch_secs = http, url, kind, refetch_secs
        self._document: dict[str, Any] | None = None
        self._fields: dict[str, dict[str, Any]] = {}  # the JWK fields of each kid (Teams' endorsements)
        self._fetched = self._failed = -math.inf
        self._lock = threading.Lock()

    def key(self, kid: str) -> tuple[Any, dict[str, Any]]:
        """(public key, its JWK fields) for `kid`; ChannelError when unknown."""
        with self._lock:
            try:
                found = self.get_signing_key(kid)
            except jwt.PyJWKClientError:
                raise ChannelError(f"no signing key {kid!r} at {self.url}") from None
            except jwt.PyJWKSetError:  # (a document with no RSA key at all)
                raise ChannelError(f"no signing key {kid!r} at {self.url}") from None
            return found.key, self._fields.get(kid, {"kid": kid})

    def fetch_data(self) -> dict[str, Any]:
        """The key document as a JWKS of its RSA signing keys (PyJWKClient calls this)."""
        if self._document is not None and time.monotonic() - self._fetched < self.refetch_secs:
            return self._document  # fetched a moment ago: an unknown kid stays unknown
        if time.monotonic() - self._failed < RETRY_FAILED_SECS:
            raise ChannelError(f"{self.url}: the key endpoint failed a moment ago")
        try:
            keys = self._load()
        except ChannelError:
            self._failed = time.monotonic()
            raise
        self._fields = {key["kid"]: key for key in keys}
        self._document, self._fetched = {"keys": keys}, time.monotonic()
        return self._document

    def _load(self) -> list[dict[str, Any]]:
        if not self.url.startswith(("http://", "https://")):
            raise ChannelError(f"{self.url!r}: the key URL must be http(s)")
        url = self.url
        if self.kind == "openid":
            config = self.http.json("GET", url, retries=1)
            url = config.get("jwks_uri") if isinstance(config, dict) else None
            if not isinstance(url, str) or not url:
                raise ChannelError(f"{self.url}: no jwks_uri in the OpenID configuration")
        document = self.http.json("GET", url, retries=1)
        if not isinstance(document, dict):
            raise ChannelError(f"{url}: the key document is not a JSON object")
        if self.kind == "x509":  # {"<kid>": "-----BEGIN CERTIFICATE-----..."}
            keys = []
            for kid, pem in document.items():
                try:
                    public_key = x509.load_pem_x509_certificate(str(pem).encode("ascii")).public_key()
                except (ValueError, UnicodeEncodeError):
                    continue
                if isinstance(public_key, RSAPublicKey):
                    keys.append({**RSAAlgorithm.to_jwk(public_key, as_dict=True), "kid": kid})
            return keys
        return [item for item in document.get("keys") or [] if isinstance(item, dict) and item.get("kid")
                and item.get("kty") == "RSA"]


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

