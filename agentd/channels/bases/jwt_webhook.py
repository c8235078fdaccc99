"""The base of webhook adapters whose platform signs every request with an RS256 JWT
(`Authorization: Bearer <JWT>`, checked against the platform's published keys) and whose
replies need an OAuth access token: Microsoft Teams (Bot Framework) and Google Chat.
A subclass names where its keys are and whom the tokens are for, and fetches its own
access token; the key set, the token cache and the HTTP sender live here."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import ChannelError
from agentd.channels.bases.jwtkeys import KeySet, bearer, verify_jwt
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.tokens import CachedToken
from agentd.channels.bases.webhook import Request, WebhookAdapter


class JwtWebhookAdapter(WebhookAdapter):
    #: The settings key holding the URL of the platform's keys, and that document's kind
    #: ("openid", "jwks" or "x509": see jwtkeys.KeySet).
    keys_setting = ""
    keys_kind = "jwks"
    #: The `iss` every request token must carry; the settings key whose value is its `aud`;
    #: seconds of clock skew allowed on `exp`.
    issuer = ""
    audience_setting = ""
    leeway = 60.0

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.keys = KeySet(self.http, str(settings.get(self.keys_setting) or ""), kind=self.keys_kind)
        self.token = CachedToken(self._fetch_token)

    def _fetch_token(self) -> tuple[str, float]:
        """(access token, lifetime in seconds) for the platform's API; ChannelError on failure."""
        raise NotImplementedError

    def request_claims(self, request: Request) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(claims, signing key's JWK fields) of the request's Bearer JWT, None without one.
        Raises ChannelError for a token that is forged, foreign, expired or for someone else."""
        token = bearer(request.headers)
        if not token:
            return None
        return verify_jwt(token, self.keys, self.issuer, str(self.settings.get(self.audience_setting)),
                          leeway=self.leeway)

    @staticmethod
    def access_token(answer: Any, platform: str) -> tuple[str, float]:
        """(token, lifetime) from a token endpoint's JSON answer (one hour when it says none)."""
        if not isinstance(answer, dict) or not answer.get("access_token"):
            raise ChannelError(f"{platform} token: no access_token in the answer")
        return str(answer["access_token"]), float(answer.get("expires_in") or 3600)

    def close(self) -> None:
        super().close()
        self.http.close()
