"""Scoped API keys: who is asking, what they may do, and what they may spend.

The configured `api_key` is the admin key. Further keys (`POST /api/keys`) carry scopes
(`read`, `message`, `manage`, `admin`), an optional list of agents (ids or name globs), a
budget per UTC day and month, a rate limit per minute, an expiry and an enabled switch.

A key's secret is shown once. The database keeps a per-key salt and a PBKDF2-SHA256 hash;
the token names its key (`agd_<key id>_<secret>`), so a check reads one row and compares
one hash in constant time. A verified token is remembered for a while (bounded), keyed
by the stored hash, so a rotated key's old secret is never accepted from memory.

Everything a check needs is read from the database: disabling, deleting or rotating a key
on one daemon holds on every daemon sharing the database at once, and so do budgets (sums
of the usage rows the key paid for: agentd/key_budgets.py) and rate limits (a per-minute
counter row). Who a request acts as is a Principal (agentd/principals.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from datetime import datetime
from typing import Any, Callable, Iterator

from pony import orm

from agentd.errors import Conflict, Forbidden, NotFound, Unauthorized
from agentd.key_budgets import KeyBudgets
from agentd.principals import ADMIN, Principal
from agentd.store import Store
from agentd.timestamps import iso, utcnow

SCOPES = ("read", "message", "manage", "admin")
TOKEN_PREFIX = "agd_"
_TOKEN_RE = re.compile(r"^agd_([0-9a-f]{32})_([A-Za-z0-9_-]{20,128})$")
_ITERATIONS = 100_000
_CACHE_MAX = 4096
_CACHE_TTL = 600.0          # seconds a verified token is trusted without hashing again
_TOUCH_EVERY = 60.0         # seconds between writes of a key's last_used_at
NO_ADMIN_KEY = ("scoped API keys need an admin key: set api_key in config.toml (or AGENTD_API_KEY) "
                "and call /api/keys with it; a daemon without one serves only loopback clients")


def _hash(secret: str, salt: bytes) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", secret.encode("utf-8"), salt, _ITERATIONS)


@contextlib.contextmanager
def _changing(ref: str) -> Iterator[None]:
    """A change to a key another request deleted (or renamed onto a taken name) meanwhile
    is answered like one to a missing key (or a taken name), not with a 500."""
    try:
        yield
    except (orm.UnrepeatableReadError, orm.OptimisticCheckError, orm.ObjectNotFound):
        raise NotFound(f"API key not found: {ref}") from None
    except orm.TransactionIntegrityError:
        raise Conflict("another API key has this name") from None


class ApiKeys:
    """Create, list, change, rotate and check scoped keys; their shared rate limits."""

    def __init__(self, store: Store, admin_key: str, audit: Callable[[str, str, dict[str, Any]], None],
                 budgets: KeyBudgets, now: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.admin_key = admin_key
        self.audit = audit
        self.budgets = budgets
        self._now = now
        self._lock = threading.Lock()
        # (key id, sha256 of the token) -> (stored hash it matched, when)
        self._verified: OrderedDict[tuple[str, bytes], tuple[bytes, float]] = OrderedDict()
        self._touched: dict[str, float] = {}
        self._rate_hits = 0

    # -- management ------------------------------------------------------------------
    def _need_admin_key(self) -> None:
        if not self.admin_key:
            raise Conflict(NO_ADMIN_KEY)

    def create(self, data: dict[str, Any], by: Principal = ADMIN) -> dict[str, Any]:
        self._need_admin_key()
        key_id = str(uuid.uuid4())
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        now = self._now()
        try:
            with orm.db_session:
                if self.store.e.ApiKeyRow.get(name=data["name"]) is not None:
                    raise Conflict(f"an API key named '{data['name']}' exists")
                self.store.e.ApiKeyRow(id=key_id, name=data["name"], salt=salt, secret_hash=_hash(secret, salt),
                                       scopes=list(data["scopes"]), agents=list(data.get("agents") or []),
                                       budget_usd_per_day=data.get("budget_usd_per_day"),
                                       budget_usd_per_month=data.get("budget_usd_per_month"),
                                       rate_limit_per_minute=data.get("rate_limit_per_minute"),
                                       expires_at=data.get("expires_at") or None,
                                       enabled=data.get("enabled", True), created_at=now, updated_at=now)
        except orm.TransactionIntegrityError:
            raise Conflict(f"an API key named '{data['name']}' exists") from None
        self.audit("key.create", data["name"], {"key_id": key_id, "by": by.name, "scopes": list(data["scopes"])})
        out = self.get(key_id)
        out["key"] = f"{TOKEN_PREFIX}{uuid.UUID(key_id).hex}_{secret}"
        return out

    def _row(self, ref: str) -> Any:
        """A key by id or name (inside a db_session)."""
        row = None
        # Pony strips a string before it looks it up: a reference with white space around it
        # would find the key without (names are stored stripped), and one of white space alone
        # is refused as no value at all.
        if ref == ref.strip():
            row = self.store.e.ApiKeyRow.get(id=ref) or self.store.e.ApiKeyRow.get(name=ref)
        if row is None:
            raise NotFound(f"API key not found: {ref}")
        return row

    def resolve(self, ref: str) -> str:
        """The id of the key `ref` names (id or name); 404 when none."""
        if not ref:
            raise NotFound("API key not found: (empty)")
        with orm.db_session:
            return self._row(ref).id

    def _public(self, row: Any, spend: tuple[float, float]) -> dict[str, Any]:
        return {"id": row.id, "name": row.name, "scopes": list(row.scopes), "agents": list(row.agents or []),
                "budget_usd_per_day": row.budget_usd_per_day, "budget_usd_per_month": row.budget_usd_per_month,
                "rate_limit_per_minute": row.rate_limit_per_minute,
                "expires_at": iso(row.expires_at) if row.expires_at else None, "enabled": row.enabled,
                "created_at": iso(row.created_at), "updated_at": iso(row.updated_at),
                "last_used_at": iso(row.last_used_at) if row.last_used_at else None,
                "spent_usd_today": round(spend[0], 10), "spent_usd_this_month": round(spend[1], 10)}

    def list(self) -> list[dict[str, Any]]:
        with orm.db_session:
            rows = list(self.store.e.ApiKeyRow.select().order_by(lambda k: (k.created_at, k.name)))
            return [self._public(r, self.budgets.spend(r.id)) for r in rows]

    def get(self, ref: str) -> dict[str, Any]:
        with orm.db_session:
            row = self._row(ref)
            return self._public(row, self.budgets.spend(row.id))

    def update(self, ref: str, data: dict[str, Any], by: Principal = ADMIN) -> dict[str, Any]:
        with _changing(ref), orm.db_session:
            row = self._row(ref)
            if "name" in data and data["name"] != row.name:
                if self.store.e.ApiKeyRow.get(name=data["name"]) is not None:
                    raise Conflict(f"an API key named '{data['name']}' exists")
            for field, value in data.items():
                if field == "expires_at":
                    value = value or None
                elif field in ("scopes", "agents"):
                    value = list(value or [])
                setattr(row, field, value)
            row.updated_at = self._now()
            key_id, name = row.id, row.name
        self.audit("key.update", name, {"key_id": key_id, "by": by.name, "fields": sorted(data)})
        return self.get(key_id)

    def delete(self, ref: str, by: Principal = ADMIN) -> dict[str, Any]:
        with _changing(ref), orm.db_session:
            row = self._row(ref)
            key_id, name = row.id, row.name
            row.delete()
        self.audit("key.delete", name, {"key_id": key_id, "by": by.name})
        return {"status": "deleted", "id": key_id}

    def rotate(self, ref: str, by: Principal = ADMIN) -> dict[str, Any]:
        """A new secret for the key; every setting stays and the old secret stops working."""
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        with _changing(ref), orm.db_session:
            row = self._row(ref)
            row.salt, row.secret_hash = salt, _hash(secret, salt)
            row.updated_at = self._now()
            key_id, name = row.id, row.name
        self.audit("key.rotate", name, {"key_id": key_id, "by": by.name})
        out = self.get(key_id)
        out["key"] = f"{TOKEN_PREFIX}{uuid.UUID(key_id).hex}_{secret}"
        return out

    # -- checking ----------------------------------------------------------------------
    @staticmethod
    def looks_like_key(token: str) -> bool:
        return token.startswith(TOKEN_PREFIX)

    def verify(self, token: str) -> Principal:
        """The principal a scoped key's token stands for; 401 when it is unknown, wrong,
        disabled or expired (each audited under the key's name, never the token)."""
        match = _TOKEN_RE.match(token)
        if match is None:
            raise Unauthorized("invalid API key")
        key_id = str(uuid.UUID(match.group(1)))
        with orm.db_session:
            row = self.store.e.ApiKeyRow.get(id=key_id)
            if row is None:
                raise Unauthorized("invalid API key")
            name, salt, stored = row.name, row.salt, bytes(row.secret_hash)
            enabled, expires = row.enabled, row.expires_at
            scopes, agents, rpm = list(row.scopes), list(row.agents or []), row.rate_limit_per_minute
        token_digest = hashlib.sha256(token.encode("utf-8")).digest()
        cache_key = (key_id, token_digest)
        now = time.monotonic()
        with self._lock:
            known = self._verified.get(cache_key)
        if known is None or known[1] + _CACHE_TTL < now or not hmac.compare_digest(known[0], stored):
            if not hmac.compare_digest(_hash(match.group(2), salt), stored):
                self.audit("key.refused", name, {"key_id": key_id, "reason": "wrong secret"})
                raise Unauthorized("invalid API key")
            with self._lock:
                self._verified[cache_key] = (stored, now)
                self._verified.move_to_end(cache_key)
                while len(self._verified) > _CACHE_MAX:
                    self._verified.popitem(last=False)
        if not enabled:
            self.audit("key.refused", name, {"key_id": key_id, "reason": "disabled"})
            raise Unauthorized(f"API key '{name}' is disabled")
        if expires is not None and self._now() >= expires:
            self.audit("key.refused", name, {"key_id": key_id, "reason": "expired"})
            raise Unauthorized(f"API key '{name}' expired at {iso(expires)}")
        self._touch(key_id, now)
        return Principal(key_id, name, scopes, agents, rpm, refused=self.refused)

    def principal(self, key_id: str, login: str | None = None) -> Principal | None:
        """The principal of a key by id; None when it is gone, disabled or expired. `login`:
        the `login_mark` of the secret a dashboard session signed in with, so a rotation
        ends that session as it ends the old secret."""
        with orm.db_session:
            row = self.store.e.ApiKeyRow.get(id=key_id)
            if row is None or not row.enabled or (row.expires_at is not None
                                                   and self._now() >= row.expires_at):
                return None
            if login is not None and not hmac.compare_digest(login, _login_mark(bytes(row.secret_hash))):
                return None
            return Principal(row.id, row.name, list(row.scopes), list(row.agents or []),
                             row.rate_limit_per_minute, refused=self.refused)

    def login_mark(self, key_id: str) -> str:
        """What a dashboard session signed in with the key keeps of its current secret."""
        with orm.db_session:
            row = self.store.e.ApiKeyRow.get(id=key_id)
            return "" if row is None else _login_mark(bytes(row.secret_hash))

    def acting(self, key_id: str) -> Principal:
        """The principal a cron job or trigger created by `key_id` runs as; Forbidden saying
        why when the key was deleted, is disabled or expired (audited as a refusal)."""
        with orm.db_session:
            row = self.store.e.ApiKeyRow.get(id=key_id)
            if row is None:
                raise Forbidden(f"the API key that created it was deleted (key id {key_id})")
            name, enabled, expires = row.name, row.enabled, row.expires_at
            who = Principal(row.id, row.name, list(row.scopes), list(row.agents or []),
                            row.rate_limit_per_minute, refused=self.refused)
        if not enabled:
            self.audit("key.refused", name, {"key_id": key_id, "reason": "disabled"})
            raise Forbidden(f"API key '{name}' is disabled")
        if expires is not None and self._now() >= expires:
            self.audit("key.refused", name, {"key_id": key_id, "reason": "expired"})
            raise Forbidden(f"API key '{name}' expired at {iso(expires)}")
        return who

    def refused(self, who: Principal, why: str, detail: dict[str, Any]) -> None:
        """Audit one refused request of a key (its name, never its secret)."""
        self.audit("key.refused", who.name, {"key_id": who.key_id, "reason": why, **detail})

    def _touch(self, key_id: str, now: float) -> None:
        with self._lock:
            last = self._touched.get(key_id)
            if last is not None and now - last < _TOUCH_EVERY:
                return
            self._touched[key_id] = now
        with orm.db_session:
            self.store.db.execute("UPDATE api_keys SET last_used_at = $t WHERE id = $k",
                                  {"t": self._now(), "k": key_id})

    # -- rate limits -------------------------------------------------------------------
    def shared_hit(self, key_id: str, rpm: int) -> float:
        """Count one request of a key on a database several daemons share (one counter row
        per key and UTC minute): 0 when allowed, else seconds until the next minute."""
        now = time.time()
        minute = int(now // 60)
        params = {"k": key_id, "m": minute}
        with orm.db_session:
            self.store.db.execute(
                "INSERT INTO api_key_rate (key_id, minute, count) VALUES ($k, $m, 1) "
                "ON CONFLICT (key_id, minute) DO UPDATE SET count = api_key_rate.count + 1", params)
            count = self.store.db.select("SELECT count FROM api_key_rate WHERE key_id = $k AND minute = $m",
                                         params)[0]
            with self._lock:
                self._rate_hits += 1
                prune = self._rate_hits % 200 == 0
            if prune:
                self.store.db.execute("DELETE FROM api_key_rate WHERE minute < $m", {"m": minute - 2})
        if count > rpm:
            return (minute + 1) * 60 - now
        return 0.0


def _login_mark(secret_hash: bytes) -> str:
    """A short digest of a key's stored hash: it changes with every rotation, and tells
    nothing of the secret (a session cookie is signed, not encrypted)."""
    return hashlib.sha256(b"agentd dashboard login\x00" + secret_hash).hexdigest()[:16]
