"""Cached bearer tokens (OAuth2 client credentials, JWT-bearer grants, tenant tokens):
fetched on first use, reused until shortly before they expire, refetched after a 401."""

from __future__ import annotations

import threading
import time
from typing import Callable

# fetch() -> (access token, lifetime in seconds as the platform said it)
Fetch = Callable[[], tuple[str, float]]


class CachedToken:
    """One platform access token shared by every send of an adapter."""

    def __init__(self, fetch: Fetch, margin: float = 120.0) -> None:
        self._fetch = fetch
        self._margin = margin  # refresh this long before expiry: a send must never race it
        self._lock = threading.Lock()
        self._token = ""
        self._expires = 0.0
        self.fetches = 0  # how many times a token was fetched (tests and logs)

    def get(self) -> str:
        """A valid token, fetching one only when none is cached or it is about to expire."""
        with self._lock:
            if self._token and time.monotonic() < self._expires:
                return self._token
            token, lifetime = self._fetch()
            self.fetches += 1
            # A short-lived token is reused for half its life at least, never past it.
            self._token = token
            self._expires = time.monotonic() + max(lifetime - self._margin, lifetime / 2)
            return token

    def clear(self) -> None:
        """Forget the token (the platform refused it): the next `get()` fetches anew."""
        with self._lock:
            self._token, self._expires = "", 0.0
