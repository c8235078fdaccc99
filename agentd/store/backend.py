"""Which database the store binds: SQLite in the home (default) or PostgreSQL from a URL.

Only the store knows the backend. This module parses and checks `database_url`, masks it
for logs, and binds a Pony `Database` to PostgreSQL. The password never comes from
config.toml: libpq reads it from `PGPASSWORD` or `~/.pgpass` when the URL has none, and
`AGENTD_DATABASE_URL` (the environment) may carry one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentd.errors import ConfigError

SCHEMES = ("postgresql", "postgres")

# Every connection talks UTC: timestamps are stored as naive UTC wall time (as in SQLite),
# and an aware datetime sent by psycopg2 must not be shifted to the server's zone.
# Given as a startup option so Pony's `DISCARD ALL` on release keeps it.
_SESSION_OPTIONS = "-c timezone=UTC"


@dataclass(frozen=True)
class DatabaseUrl:
    """A checked PostgreSQL URL (`postgresql://user[:password]@host[:port]/dbname?...`)."""

    url: str

    @property
    def masked(self) -> str:
        """The URL with any password replaced by `***` (for logs and errors)."""
        return mask_url(self.url)

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg2.connect() arguments (the DSN plus the UTC session option)."""
        return {"dsn": self.url, "options": _SESSION_OPTIONS, "application_name": "agentd"}


def mask_url(url: str) -> str:
    """`url` with the password (if any) replaced by `***`; anything unparsable is hidden."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:
        return "<unparsable database url>"
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = re.sub(r"(?i)(password=)[^&]*", r"\1***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_password(url: str) -> bool:
    """True when the URL carries a password (in the user info or as `?password=`)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rsplit("@", 1)[0] if "@" in parts.netloc else ""
    return ":" in userinfo or bool(re.search(r"(?i)(^|&)password=", parts.query))


def parse_database_url(url: str, source: str, allow_password: bool) -> DatabaseUrl:
    """Check a `database_url` from `source` (a config key or env var name, for messages).

    Raises ConfigError for anything but a PostgreSQL URL with a database name, and for a
    password when `allow_password` is false (config.toml may not hold secrets)."""
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"{source}: not a URL ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"{source}: must be a postgresql:// URL (got scheme {parts.scheme or 'none'!r}); "
                          "leave it unset for the embedded SQLite database")
    if not parts.path.strip("/"):
        raise ConfigError(f"{source}: names no database (postgresql://user@host/dbname)")
    if not allow_password and has_password(url):
        raise ConfigError(f"{source}: must not contain a password (secrets never go in config.toml); "
                          "set PGPASSWORD, use ~/.pgpass, or put the whole URL in AGENTD_DATABASE_URL")
    return DatabaseUrl(url)


def bind_postgres(db: Any, target: DatabaseUrl) -> None:
    """Bind a Pony Database to PostgreSQL (psycopg2, imported only here)."""
    try:
        import psycopg2  # noqa: F401 - a clear message beats Pony's import error
    except ImportError:
        raise ConfigError("database_url needs psycopg2: pip install 'agentd[postgres]'") from None
    db.bind(provider="postgres", **target.connect_kwargs())


def connect_postgres(target: DatabaseUrl) -> Any:
    """A plain psycopg2 connection (autocommit) beside Pony's pool: migrations and locks."""
    import psycopg2

    conn = psycopg2.connect(**target.connect_kwargs())
    conn.autocommit = True
    return conn
