"""Matrix access tokens that expire (client-server API v1.3+, "refresh tokens").

A homeserver that issues refresh tokens lets an access token expire: a call with it answers
401 `M_UNKNOWN_TOKEN` with `soft_logout: true`. The client then trades its refresh token at
`POST /_matrix/client/v3/refresh` for a new access token (and usually a new refresh token,
the old one being spent) and repeats the call. This is a `requests` auth hook, so every
call of the adapter (sync, send, typing, reactions, media) is covered the same way.

A rotated pair is handed to `save` (the daemon writes it to `secrets.env` under the
variables the section names), so a restart does not start from a spent refresh token.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import requests
import requests.auth

from agentd.channels.adapter import ChannelError

log = logging.getLogger("agentd.channels.matrix")


class RefreshFailed(ChannelError):
    """The homeserver refused the refresh token (spent, revoked, or refresh unsupported)."""


def unknown_token(response: requests.Response) -> tuple[bool, bool]:
    """(the answer is M_UNKNOWN_TOKEN, its soft_logout flag)."""
    if response.status_code != 401:
        return False, False
    try:
        body = response.json()
    except ValueError:
        return False, False
    if not isinstance(body, dict) or body.get("errcode") != "M_UNKNOWN_TOKEN":
        return False, False
    return True, body.get("soft_logout") is True


class RefreshingToken(requests.auth.AuthBase):
    """Bearer auth whose token is refreshed once per expiry, whichever thread meets it first."""

    def __init__(self, homeserver: str, access: str, refresh: str,
                 save: Callable[[str, str], None], timeout: float = 15.0) -> None:
        self.url = homeserver.rstrip("/") + "/_matrix/client/v3/refresh"
        self.access, self.refresh = access, refresh
        self._save = save
        self._timeout = timeout
        self._lock = threading.Lock()
        # The refresh call goes out on its own session: it carries no access token.
        self._session = requests.Session()
        self._session.trust_env = False
        self.refreshes = 0

    @property
    def header(self) -> str:
        return f"Bearer {self.access}"

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = self.header
        request.register_hook("response", self._on_response)
        return request

    def _on_response(self, response: requests.Response, **kwargs: Any) -> requests.Response:
        expired, soft = unknown_token(response)
        if not expired or not soft or getattr(response.request, "_agentd_retried", False):
            return response
        used = response.request.headers.get("Authorization", "")
        with self._lock:
            if used == self.header:  # not yet refreshed by another call that met the expiry
                self._refresh()
        response.content  # noqa: B018 - read it so the connection goes back to the pool
        response.close()
        again = response.request.copy()
        again.headers["Authorization"] = self.header
        again._agentd_retried = True  # type: ignore[attr-defined] - one retry per call
        answer = response.connection.send(again, **kwargs)
        answer.history.append(response)
        answer.request = again
        return answer

    def _refresh(self) -> None:
        try:
            response = self._session.post(self.url, json={"refresh_token": self.refresh}, timeout=self._timeout)
        except requests.RequestException as exc:
            raise RefreshFailed(f"POST /_matrix/client/v3/refresh: {type(exc).__name__}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or not isinstance(body, dict) or not isinstance(body.get("access_token"), str) \
                or not body["access_token"]:
            errcode = body.get("errcode") if isinstance(body, dict) else None
            raise RefreshFailed(f"POST /_matrix/client/v3/refresh: HTTP {response.status_code}"
                                f"{' ' + str(errcode) if errcode else ''} (the refresh token was refused; "
                                "log the bot in again and store the new tokens)")
        self.access = body["access_token"]
        if isinstance(body.get("refresh_token"), str) and body["refresh_token"]:
            self.refresh = body["refresh_token"]  # the old one is spent once the new token is used
        self.refreshes += 1
        log.info("matrix: access token refreshed (expires in %s ms)", body.get("expires_in_ms", "?"))
        self._save(self.access, self.refresh)

    def close(self) -> None:
        self._session.close()
