"""`agentd doctor`: installation checks, each ok / warn / fail with a message."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import sqlite3
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentd import tomlsafe
from agentd.cli.client import HEALTH_TIMEOUT, ApiClient, DaemonInfo, find_daemon, read_daemon_file
from agentd.config import Config, load_config, split_listen, unknown_keys
from agentd.errors import AgentdError
from agentd.store.db import SQLITE_MAGIC

# Free space on the disk holding the database: under the first a warning, under the second
# a failure (writes are about to answer 507). Documented in docs/cli.md and docs/operations.md.
DISK_WARN_BYTES = 100 * 1024 * 1024
DISK_FAIL_BYTES = 10 * 1024 * 1024


@dataclass
class Check:
    """One diagnostic result."""

    name: str
    status: str  # ok | warn | fail
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "message": self.message}


def _port_free(addr: str) -> bool:
    host, port = split_listen(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


def _check_postgres(cfg: Config) -> Check:
    """database_url: the server answers and its schema is one this agentd can use."""
    from agentd.store.backend import connect_postgres
    from agentd.store.migrate import SCHEMA_VERSION, VERSION_TABLE

    where = cfg.database.masked
    try:
        conn = connect_postgres(cfg.database)
    except ImportError:
        return Check("database", "fail", "database_url needs psycopg2: pip install 'agentd[postgres]'")
    except Exception as exc:  # noqa: BLE001 - psycopg2.OperationalError and kin
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Check("database", "fail", f"cannot connect to {where}: {first}")
    try:
        cur = conn.cursor()
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,))
        version = None
        if cur.fetchone()[0]:
            cur.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}")
            version = cur.fetchone()[0]
    finally:
        conn.close()
    if version is None:
        return Check("database", "warn", f"PostgreSQL {where} is empty; the schema is created on first start")
    if version > SCHEMA_VERSION:
        return Check("database", "fail", f"PostgreSQL {where} has schema version {version}, newer than "
                                         f"this agentd's ({SCHEMA_VERSION})")
    return Check("database", "ok", f"PostgreSQL {where}, schema version {version}")


def _check_sqlite(path: Path) -> Check:
    """The database file is SQLite (or empty), with a schema this agentd can use."""
    from agentd.store.migrate import SCHEMA_VERSION, VERSION_TABLE, newer_schema

    with open(path, "rb") as fh:
        if fh.read(16) != SQLITE_MAGIC and path.stat().st_size:
            return Check("database", "fail", f"{path} is not a SQLite file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        try:
            known = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                 (VERSION_TABLE,)).fetchone()
            version = conn.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}").fetchone()[0] if known else None
        finally:
            conn.close()
    except sqlite3.Error:
        version = None  # unreadable now (locked, say): the start says what it finds
    if version is not None and version > SCHEMA_VERSION:
        return Check("database", "fail", f"database {path}: {newer_schema(version)}")
    return Check("database", "ok", f"{path} is a SQLite database")


def check_disk(where: Path) -> Check:
    """Free space and writability of the directory holding the database (or the home)."""
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    text = f"{free // (1024 * 1024)} MB free on the disk holding {where}"
    if not os.access(probe, os.W_OK):
        return Check("disk_space", "fail", f"{probe} is not writable: every write would answer 503 ({text})")
    if free < DISK_FAIL_BYTES:
        return Check("disk_space", "fail", f"{text}: under {DISK_FAIL_BYTES // (1024 * 1024)} MB writes will "
                                           "soon answer 507; free some space")
    if free < DISK_WARN_BYTES:
        return Check("disk_space", "warn", f"{text} (under {DISK_WARN_BYTES // (1024 * 1024)} MB)")
    return Check("disk_space", "ok", text)


def _check_manifests(agents_dir: Path) -> Check:
    from agentd.agents.manifest import ManifestError, parse_manifest

    files = sorted(agents_dir.glob("*.toml")) if agents_dir.is_dir() else []
    bad = []
    for path in files:
        try:
            parse_manifest(path.read_text(encoding="utf-8"))
        except (ManifestError, OSError, UnicodeDecodeError) as exc:
            bad.append(f"{path.name}: {getattr(exc, 'message', exc)}")
    if bad:
        return Check("agent_manifests", "fail", "; ".join(bad))
    return Check("agent_manifests", "ok", f"{len(files)} manifest(s) valid")


def _check_skills(skills_dir: Path) -> Check:
    """Each skill's SKILL.md front matter; an invalid skill is listed but never offered."""
    from agentd.skills import check_home

    found = check_home(skills_dir)
    bad = [f"{name}: {'; '.join(errors)}" for name, errors in found if errors]
    if bad:
        return Check("skills", "warn", "; ".join(bad))
    return Check("skills", "ok", f"{len(found)} skill(s) valid")


def _daemon_providers(cfg: Config, live: DaemonInfo) -> list[dict[str, Any]] | None:
    """The running daemon's GET /api/providers (whose keys it holds), or None when it refuses."""
    import requests

    try:
        response = ApiClient(live.base_url, cfg.api_key, timeout=HEALTH_TIMEOUT).request("GET", "/api/providers")
        listing = response.json() if response.ok else None
    except (requests.RequestException, ValueError):
        return None
    return listing if isinstance(listing, list) else None


def _check_keys(cfg: Config, live: DaemonInfo | None) -> Check:
    """The default provider's key as the daemon sees it: asked of a running daemon (a key set
    through its API lives in its process), else read as a start would (environment first,
    then secrets.env)."""
    provider, env = cfg.default_model.provider, cfg.default_model.api_key_env
    listing = _daemon_providers(cfg, live) if live is not None else None
    if listing is not None:
        keyed = sorted(str(p.get("id")) for p in listing if p.get("auth_status") == "configured")
        held = f"; the daemon has keys for {', '.join(keyed)}" if keyed else "; the daemon has no provider keys"
        entry = next((p for p in listing if p.get("id") == provider), None)
        if entry is not None and (not env or env == entry.get("api_key_env")):
            if entry.get("auth_status") == "configured":
                others = [name for name in keyed if name != provider]
                also = f"; it also has keys for {', '.join(others)}" if others else ""
                return Check("provider_keys", "ok", f"the daemon has {env} for {provider}{also}")
            if entry.get("auth_status") == "not_required" or not env:
                return Check("provider_keys", "ok", f"default provider {provider} needs no key{held}")
            return Check("provider_keys", "warn",
                         f"the daemon has no {env}: agents on the default provider {provider} cannot run; "
                         f"run `curl -X POST {live.base_url}/api/providers/{provider}/key` with "
                         f'{{"api_key": "..."}} or set {env}{held}')
    if not env:
        return Check("provider_keys", "ok", f"default provider {provider} needs no key")
    if os.environ.get(env):
        return Check("provider_keys", "ok", f"{env} is set for {provider}")
    if _held_secrets(cfg).get(env):
        return Check("provider_keys", "ok", f"{env} for {provider} is in {cfg.secrets_path}")
    unasked = "" if live is None or listing is not None else (
        f" (the daemon at {live.base_url} did not say which keys it holds: give the CLI its API key, AGENTD_API_KEY)")
    return Check("provider_keys", "warn",
                 f"{env} is not set: agents on the default provider {provider} cannot run{unasked}")


def _held_secrets(cfg: Config) -> dict[str, str]:
    """What secrets.env holds (nothing when it is unreadable: `_check_secrets_file` fails it)."""
    from agentd.providers import read_secrets

    try:
        return read_secrets(cfg.secrets_path)
    except AgentdError:
        return {}


def _check_secrets_file(path: Path) -> Check | None:
    from agentd.providers import read_secrets

    if not path.exists():
        return None
    try:
        read_secrets(path)
    except AgentdError as exc:
        return Check("secrets_file", "fail", exc.message)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Check("secrets_file", "warn", f"{path} has mode {oct(mode)}; run chmod 600 {path}")
    return Check("secrets_file", "ok", f"{path} is private (0600)")


def _check_exposure(cfg: Config, live: DaemonInfo | None) -> Check:
    """Listening beyond loopback without a key serves the API to the whole network. A running
    daemon's own address counts (its service may set AGENTD_LISTEN where the CLI does not)."""
    from agentd.server.webguard import host_name

    listen = live.listen_addr if live is not None else cfg.api_listen
    host = host_name(split_listen(listen)[0])
    loopback = host == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
    if loopback:
        return Check("exposure", "ok", f"listening on loopback ({listen})")
    if cfg.api_key:
        return Check("exposure", "ok", f"listening on {listen}; api_key is set")
    return Check("exposure", "warn",
                 f"listening on non-loopback address {listen} without an api_key: remote clients "
                 "are refused (401), but set api_key (or AGENTD_API_KEY) to serve them, or bind 127.0.0.1")


def _check_proxies(cfg: Config) -> Check | None:
    """Behind a trusted proxy, clients are remote: without a key none of them is served."""
    proxies = cfg.api.trusted_proxies
    if not proxies:
        return None
    if cfg.api_key:
        return Check("trusted_proxies", "ok", f"forwarding headers trusted from {', '.join(proxies)}; "
                     "api_key is set")
    return Check("trusted_proxies", "warn",
                 f"trusted_proxies is set ({', '.join(proxies)}) but api_key is not: clients behind "
                 "the proxy are remote and get 401; set api_key (or AGENTD_API_KEY)")


def _check_mcp_servers(cfg: Config) -> Check:
    """Each `[[mcp_servers]]` server starts and lists its tools."""
    if not cfg.mcp_servers:
        return Check("mcp_servers", "ok", "no MCP servers configured")
    try:
        from agentd.mcp.client import check_servers
    except ImportError:
        from agentd.mcp.hub import MISSING_EXTRA

        return Check("mcp_servers", "fail", MISSING_EXTRA)
    results = check_servers(cfg.mcp_servers)
    return Check("mcp_servers", "ok" if all(ok for ok, _ in results) else "fail",
                 "; ".join(detail for _, detail in results))


def _cron_deliveries(cfg: Config) -> list[tuple[str, dict[str, Any]]]:
    """(name, delivery) of every cron job, read without writing (the database check reports
    a database that cannot be read)."""
    try:
        if cfg.database is not None:
            from agentd.store.backend import connect_postgres

            conn: Any = connect_postgres(cfg.database)
        elif cfg.db_path.exists():
            conn = sqlite3.connect(f"file:{cfg.db_path}?mode=ro", uri=True, timeout=5.0)
        else:
            return []
        try:
            cur = conn.cursor()
            cur.execute("SELECT name, delivery FROM cron_jobs ORDER BY name")
            rows = cur.fetchall()
        finally:
            conn.close()
    except Exception:  # noqa: BLE001 - no server, no schema yet, not a database
        return []
    return [(name, json.loads(delivery) if isinstance(delivery, str) else delivery) for name, delivery in rows]


def _check_cron_webhooks(cfg: Config) -> Check | None:
    """Cron webhooks signed with a `secret_env` a start would not find (environment first,
    then secrets.env): every delivery of theirs fails."""
    from agentd.schedules.delivery import unset_secret

    signed = [(name, delivery) for name, delivery in _cron_deliveries(cfg)
              if delivery.get("kind") == "webhook" and delivery.get("secret_env")]
    if not signed:
        return None
    environ = {**_held_secrets(cfg), **os.environ}
    missing = [(name, variable) for name, delivery in signed if (variable := unset_secret(delivery, environ))]
    if not missing:
        return Check("cron_webhooks", "ok", f"the secret_env of {len(signed)} cron webhook(s) is set")
    return Check("cron_webhooks", "warn", "; ".join(
        f"cron job {name}: secret_env {variable} is set neither in the environment nor in "
        f"{cfg.secrets_path}: every delivery of its webhook fails" for name, variable in missing))


def run_checks(home: Path) -> list[Check]:
    """Run every check in order; later checks are skipped when the config is unusable."""
    checks: list[Check] = []
    if home.is_dir():
        checks.append(Check("home_dir", "ok", str(home)))
    elif home.exists():
        checks.append(Check("home_dir", "fail", f"{home} exists but is not a directory"))
        return checks
    else:
        checks.append(Check("home_dir", "warn", f"{home} does not exist; `agentd init` creates it"))
    config_path = home / "config.toml"
    try:
        if config_path.exists():
            tomlsafe.loads(config_path.read_text(encoding="utf-8"))
        cfg = load_config(home)
        unknown = unknown_keys(cfg.raw)
        if unknown:
            checks.append(Check("config", "warn", f"{config_path} parsed; keys agentd does not read, ignored: "
                                f"{', '.join(unknown)}"))
        else:
            checks.append(Check("config", "ok", f"{config_path} parsed" if config_path.exists()
                                else "no config.toml; defaults apply"))
    except UnicodeDecodeError:
        checks.append(Check("config", "fail", f"{config_path} is not UTF-8 text"))
        return checks
    except (AgentdError, tomllib.TOMLDecodeError, OSError) as exc:
        checks.append(Check("config", "fail", getattr(exc, "message", str(exc))))
        return checks
    live = find_daemon(cfg)
    if live is not None:
        checks.append(Check("daemon", "ok", f"running at {live.base_url} (pid {live.pid})"))
    else:
        if _port_free(cfg.api_listen):
            checks.append(Check("port", "ok", f"{cfg.api_listen} is free"))
        else:
            # `agentd start` would fail on it: a fail, not a warning.
            checks.append(Check("port", "fail", f"{cfg.api_listen} is in use by another program"))
        if read_daemon_file(cfg.daemon_file) is not None or cfg.daemon_file.exists():
            checks.append(Check("stale_daemon_file", "warn",
                                f"{cfg.daemon_file} exists but no daemon answers; "
                                "`agentd start` removes it"))
    if cfg.database is not None:
        checks.append(_check_postgres(cfg))
    elif not cfg.db_path.exists():
        checks.append(Check("database", "warn", f"{cfg.db_path} missing; it is created on first start"))
    else:
        checks.append(_check_sqlite(cfg.db_path))
    checks.append(check_disk(cfg.db_path.parent if cfg.db_path.parent.exists() else home))
    checks.append(_check_manifests(cfg.agents_dir))
    checks.append(_check_skills(cfg.home / "skills"))
    checks.append(_check_keys(cfg, live))
    checks.append(_check_exposure(cfg, live))
    proxies = _check_proxies(cfg)
    if proxies is not None:
        checks.append(proxies)
    secrets = _check_secrets_file(cfg.secrets_path)
    if secrets is not None:
        checks.append(secrets)
    webhooks = _check_cron_webhooks(cfg)
    if webhooks is not None:
        checks.append(webhooks)
    checks.append(_check_mcp_servers(cfg))
    return checks
