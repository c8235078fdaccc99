"""`agentd doctor` (agentd/cli/doctor.py): every check on a home not yet created, the
database checks on SQLite and PostgreSQL, and the provider key check (the running daemon's
keys, else what a start would load)."""

from __future__ import annotations

import http.server
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

import pgtest
import psycopg2
import pytest
from support import FAST_API, Daemon, free_port, make_home, run_cli

from agentd.store.backend import parse_database_url
from agentd.store.db import open_store
from agentd.store.migrate import SCHEMA_VERSION, VERSION_TABLE


def doctor(home: Path, port: int | None = None, **env: str) -> tuple[int, list[dict[str, str]]]:
    r = run_cli(home, "doctor", "--json", port=port, env_extra=env)
    return r.returncode, json.loads(r.stdout)


# A daemon holding no provider key, whatever the environment running the tests has.
NO_KEYS = {name: "" for name in os.environ if name.endswith("_API_KEY")} | {"ANTHROPIC_API_KEY": ""}


def test_doctor_on_a_home_not_yet_created_runs_every_check_in_order(tmp_path: Path) -> None:
    home, port = tmp_path / "new-home", free_port()
    code, checks = doctor(home, port, AGENTD_DATABASE_URL="", ANTHROPIC_API_KEY="")
    disk = checks.pop(4)
    assert (code, checks) == (0, [
        {"check": "home_dir", "status": "warn", "message": f"{home} does not exist; `agentd init` creates it"},
        {"check": "config", "status": "ok", "message": "no config.toml; defaults apply"},
        {"check": "port", "status": "ok", "message": f"127.0.0.1:{port} is free"},
        {"check": "database", "status": "warn",
         "message": f"{home / 'data' / 'agentd.db'} missing; it is created on first start"},
        {"check": "agent_manifests", "status": "ok", "message": "0 manifest(s) valid"},
        {"check": "skills", "status": "ok", "message": "0 skill(s) valid"},
        {"check": "provider_keys", "status": "warn",
         "message": "ANTHROPIC_API_KEY is not set: agents on the default provider anthropic cannot run"},
        {"check": "exposure", "status": "ok", "message": f"listening on loopback (127.0.0.1:{port})"},
        {"check": "mcp_servers", "status": "ok", "message": "no MCP servers configured"}])
    # The nearest directory that exists is measured; the message names the home.
    assert disk["check"] == "disk_space" and disk["message"].endswith(f" MB free on the disk holding {home}")
    assert not home.exists()  # doctor only looks


def test_doctor_reads_the_sqlite_file_and_the_manifests_without_changing_them(tmp_path: Path) -> None:
    home, port = make_home(tmp_path), free_port()
    db = home / "data" / "agentd.db"
    db.parent.mkdir()
    db.touch()  # an empty file: SQLite makes it a database on first start
    (home / "agents").mkdir()
    (home / "agents" / "one.toml").write_text('name = "one"\n')
    (home / "agents" / "two.toml").write_text('name = "two"\n')
    (home / "daemon.json").write_text("{}")

    def found() -> dict[str, dict[str, str]]:
        return {c["check"]: c for c in doctor(home, port, AGENTD_DATABASE_URL="")[1]}

    checks = found()
    assert list(checks)[0] == "home_dir" and checks["home_dir"] == {"check": "home_dir", "status": "ok",
                                                                    "message": str(home)}
    assert checks["database"] == {"check": "database", "status": "ok", "message": f"{db} is a SQLite database"}
    assert checks["disk_space"]["message"].endswith(f" MB free on the disk holding {db.parent}")
    assert checks["agent_manifests"] == {"check": "agent_manifests", "status": "ok", "message": "2 manifest(s) valid"}
    assert checks["stale_daemon_file"] == {
        "check": "stale_daemon_file", "status": "warn",
        "message": f"{home / 'daemon.json'} exists but no daemon answers; `agentd start` removes it"}
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    assert found()["database"]["status"] == "ok"
    # A schema from a newer agentd, which `agentd start` refuses: refused here in its words.
    open_store(db).close()
    assert found()["database"] == {"check": "database", "status": "ok", "message": f"{db} is a SQLite database"}
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"INSERT INTO {VERSION_TABLE} (version, applied_at, description) VALUES (?, ?, ?)",
                     (SCHEMA_VERSION + 1, "2026-12-01T00:00:00", "from a newer agentd"))
    conn.close()
    assert found()["database"] == {
        "check": "database", "status": "fail",
        "message": f"database {db}: database schema version {SCHEMA_VERSION + 1} is newer than this agentd's "
                   f"({SCHEMA_VERSION}); upgrade agentd"}
    started = run_cli(home, "start", port=free_port(), env_extra={"AGENTD_DATABASE_URL": ""})
    assert started.returncode == 1 and started.stderr.strip().splitlines()[-1] == \
        "error: " + found()["database"]["message"]
    (home / "agents" / "two.toml").write_text('name = "two"\nprofile = "nonsense"\n')
    assert found()["agent_manifests"] == {
        "check": "agent_manifests", "status": "fail",
        "message": "two.toml: invalid manifest format: profile: unknown profile 'nonsense'; one of automation, "
                   "coding, custom, full, messaging, minimal, research"}
    (home / "agents" / "one.toml").write_bytes('name = "café"\n'.encode("latin-1"))
    assert found()["agent_manifests"]["message"] == (
        "one.toml: 'utf-8' codec can't decode byte 0xe9 in position 11: invalid continuation byte; "
        "two.toml: invalid manifest format: profile: unknown profile 'nonsense'; one of automation, "
        "coding, custom, full, messaging, minimal, research")
    db.write_bytes(b"SQLite format 2\x00" + bytes(100))
    assert found()["database"] == {"check": "database", "status": "fail", "message": f"{db} is not a SQLite file"}
    assert db.read_bytes().startswith(b"SQLite format 2")


def test_doctor_checks_the_postgresql_schema(tmp_path: Path) -> None:
    url = pgtest.databases().new_url()
    home = make_home(tmp_path)

    def database(address: str = url) -> tuple[int, dict[str, str]]:
        code, checks = doctor(home, free_port(), AGENTD_DATABASE_URL=address)
        return code, next(c for c in checks if c["check"] == "database")

    assert database() == (0, {"check": "database", "status": "warn",
                              "message": f"PostgreSQL {url} is empty; the schema is created on first start"})
    open_store(home / "data" / "agentd.db", parse_database_url(url, "test", allow_password=False)).close()
    assert database() == (0, {"check": "database", "status": "ok",
                              "message": f"PostgreSQL {url}, schema version {SCHEMA_VERSION}"})
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"INSERT INTO {VERSION_TABLE} (version, applied_at, description) VALUES (%s, %s, %s)",
                        (SCHEMA_VERSION + 1, "2026-12-01T00:00:00", "from a newer agentd"))
    finally:
        conn.close()
    assert database() == (1, {"check": "database", "status": "fail",
                              "message": f"PostgreSQL {url} has schema version {SCHEMA_VERSION + 1}, newer than "
                                         f"this agentd's ({SCHEMA_VERSION})"})
    nobody = f"postgresql://agentd:s3cret@127.0.0.1:{free_port()}/agentd"
    code, check = database(nobody)
    assert (code, check["status"]) == (1, "fail") and "s3cret" not in check["message"]
    assert check["message"].startswith(f"cannot connect to postgresql://agentd:***@127.0.0.1:{nobody.split(':')[3]}")
    assert "Connection refused" in check["message"] and "\n" not in check["message"]


@pytest.mark.parametrize("module, config, env, check, message", [
    ("psycopg2", "", {"AGENTD_DATABASE_URL": "postgresql://agentd@127.0.0.1:5432/agentd"}, "database",
     "database_url needs psycopg2: pip install 'agentd[postgres]'"),
    ("mcp", '[[mcp_servers]]\nname = "files"\ncommand = "mcp-files"\n', {}, "mcp_servers",
     "the MCP SDK is not installed: pip install 'agentd[mcp]'"),
])
def test_doctor_without_an_extra_says_what_to_install(tmp_path: Path, monkeypatch, module: str, config: str,
                                                      env: dict[str, str], check: str, message: str) -> None:
    # A CLI of its own (not forked from a zygote that has the library loaded), where importing
    # it fails as it does when the extra is not installed.
    monkeypatch.setenv("AGENTD_TEST_FORK", "0")
    shim = tmp_path / "shim" / module
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(f'raise ImportError("No module named {module!r}")\n')
    path = os.pathsep.join(p for p in (str(shim.parent), os.environ.get("PYTHONPATH", "")) if p)
    code, checks = doctor(make_home(tmp_path, config + FAST_API), free_port(), PYTHONPATH=path,
                          **{"AGENTD_DATABASE_URL": "", **env})
    assert (code, next(c for c in checks if c["check"] == check)) == (1, {
        "check": check, "status": "fail", "message": message})


def test_doctor_on_a_keyless_provider_and_loopback_names(tmp_path: Path) -> None:
    port = free_port()
    home = make_home(tmp_path, f'api_listen = "localhost:{port}"\n' + FAST_API +
                               '[default_model]\nprovider = "ollama"\nmodel = "llama3"\napi_key_env = ""\n')

    def checks(**env: str) -> dict[str, dict[str, str]]:
        return {c["check"]: c for c in doctor(home, **env)[1]}

    found = checks()
    assert [found[name]["message"] for name in ("port", "exposure")] == [
        f"localhost:{port} is free", f"listening on loopback (localhost:{port})"]
    assert found["provider_keys"] == {"check": "provider_keys", "status": "ok",
                                      "message": "default provider ollama needs no key"}
    found = checks(AGENTD_LISTEN=f"[::1]:{port}")
    assert [found[name]["message"] for name in ("port", "exposure")] == [
        f"[::1]:{port} is free", f"listening on loopback ([::1]:{port})"]
    # Every address: the API's key serves remote clients; without one they get 401.
    assert checks(AGENTD_LISTEN=f"0.0.0.0:{port}", AGENTD_API_KEY="k-doctor")["exposure"] == {
        "check": "exposure", "status": "ok", "message": f"listening on 0.0.0.0:{port}; api_key is set"}
    assert checks(AGENTD_LISTEN=f"0.0.0.0:{port}")["exposure"] == {
        "check": "exposure", "status": "warn",
        "message": f"listening on non-loopback address 0.0.0.0:{port} without an api_key: remote clients are "
                   "refused (401), but set api_key (or AGENTD_API_KEY) to serve them, or bind 127.0.0.1"}
    # A host name other than localhost may resolve to any address: it counts as remote. The
    # rest of 127.0.0.0/8 and a name in capitals are loopback.
    assert checks(AGENTD_LISTEN=f"agentd.example:{port}")["exposure"] == {
        "check": "exposure", "status": "warn",
        "message": f"listening on non-loopback address agentd.example:{port} without an api_key: remote "
                   "clients are refused (401), but set api_key (or AGENTD_API_KEY) to serve them, or bind 127.0.0.1"}
    assert [checks(AGENTD_LISTEN=f"{host}:{port}")["exposure"]["message"] for host in ("127.0.0.2", "LOCALHOST")] == [
        f"listening on loopback (127.0.0.2:{port})", f"listening on loopback (LOCALHOST:{port})"]
    d = Daemon(home, env_extra={**NO_KEYS, "OPENAI_API_KEY": "sk-doctor", "GROQ_API_KEY": "gsk-doctor"}).start()
    try:
        found = checks()
    finally:
        d.stop()
    assert found["provider_keys"] == {"check": "provider_keys", "status": "ok",
                                      "message": "default provider ollama needs no key; the daemon has keys for groq, openai"}


def provider_keys(home: Path, port: int, **env: str) -> dict[str, str]:
    # The CLI's own environment never has the key: only the daemon (or its home) may.
    r = run_cli(home, "doctor", "--json", port=port, env_extra={"ANTHROPIC_API_KEY": "", **env})
    return {c["check"]: c for c in json.loads(r.stdout)}["provider_keys"]


def test_doctor_asks_the_daemon_for_its_keys_then_reads_the_home(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    d = Daemon(home, env_extra=NO_KEYS).start()
    try:
        assert provider_keys(home, d.port) == {"check": "provider_keys", "status": "warn", "message":
            "the daemon has no ANTHROPIC_API_KEY: agents on the default provider anthropic cannot run; run "
            f"`curl -X POST http://127.0.0.1:{d.port}/api/providers/anthropic/key` with "
            '{"api_key": "..."} or set ANTHROPIC_API_KEY; the daemon has no provider keys'}
        r = d.post("/api/providers/anthropic/key", json={"api_key": "sk-ant-doctor"})
        assert r.status_code == 200, r.text
        assert provider_keys(home, d.port) == {"check": "provider_keys", "status": "ok",
                                               "message": "the daemon has ANTHROPIC_API_KEY for anthropic"}
        for provider in ("openai", "groq"):
            d.post(f"/api/providers/{provider}/key", json={"api_key": "sk-doctor"}).raise_for_status()
        check = provider_keys(home, d.port)
        assert check == {"check": "provider_keys", "status": "ok",
                         "message": "the daemon has ANTHROPIC_API_KEY for anthropic; "
                                    "it also has keys for groq, openai"}, check
        assert "sk-ant-doctor" not in json.dumps(check)
    finally:
        d.stop()
    # No daemon: the key the API wrote to secrets.env is what the next start loads.
    check = provider_keys(home, d.port)
    assert check == {"check": "provider_keys", "status": "ok",
                     "message": f"ANTHROPIC_API_KEY for anthropic is in {home / 'secrets.env'}"}, check
    (home / "secrets.env").unlink()
    check = provider_keys(home, d.port)
    assert check["status"] == "warn" and check["message"].startswith("ANTHROPIC_API_KEY is not set")


def test_doctor_says_when_the_daemon_would_not_tell_it_the_keys(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    # The key lives in the daemon's environment only (a service's environment file).
    d = Daemon(home, api_key="k-doctor", env_extra={"AGENTD_API_KEY": "k-doctor", "ANTHROPIC_API_KEY": "sk-ant"}).start()
    try:
        check = provider_keys(home, d.port)
        told = provider_keys(home, d.port, AGENTD_API_KEY="k-doctor")
    finally:
        d.stop()
    assert check == {"check": "provider_keys", "status": "warn",
                     "message": "ANTHROPIC_API_KEY is not set: agents on the default provider anthropic cannot run "
                                f"(the daemon at http://127.0.0.1:{d.port} did not say which keys it holds: "
                                "give the CLI its API key, AGENTD_API_KEY)"}, check
    assert told == {"check": "provider_keys", "status": "ok",
                    "message": "the daemon has ANTHROPIC_API_KEY for anthropic"}


def test_doctor_gives_up_on_a_daemon_that_never_lists_its_keys(tmp_path: Path) -> None:
    # A daemon that answers its health probe, then nothing: doctor waits the probe's 2 s for
    # the provider listing, not the minutes a stuck daemon could take.
    release = threading.Event()

    class Stuck(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the handler's API
            if self.path != "/api/health":
                release.wait(60)
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    home = make_home(tmp_path)
    (home / "daemon.json").write_text(json.dumps({"listen_addr": f"127.0.0.1:{port}", "pid": os.getpid()}))
    try:
        began = time.monotonic()
        check = provider_keys(home, port)
        took = time.monotonic() - began
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert check == {"check": "provider_keys", "status": "warn",
                     "message": "ANTHROPIC_API_KEY is not set: agents on the default provider anthropic cannot run "
                                f"(the daemon at http://127.0.0.1:{port} did not say which keys it holds: "
                                "give the CLI its API key, AGENTD_API_KEY)"}
    assert took < 30, took


def test_doctor_reads_a_key_of_the_default_models_own_name_from_the_environment(tmp_path: Path) -> None:
    # The daemon lists the provider's own variable; a default model keyed by another name is
    # judged as a start would read it, not by the daemon's answer for the provider.
    home = make_home(tmp_path, FAST_API + '[default_model]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-6"\n'
                                          'api_key_env = "MY_ANTHROPIC_KEY"\n')
    d = Daemon(home, env_extra=NO_KEYS).start()
    try:
        assert provider_keys(home, d.port, MY_ANTHROPIC_KEY="sk-ant-own") == {
            "check": "provider_keys", "status": "ok", "message": "MY_ANTHROPIC_KEY is set for anthropic"}
        # A default provider the daemon does not list at all: its key is judged as a start reads it.
        (home / "config.toml").write_text(FAST_API + '[default_model]\nprovider = "nosuch"\nmodel = "m"\n'
                                                     'api_key_env = "NOSUCH_KEY"\n')
        assert provider_keys(home, d.port) == {
            "check": "provider_keys", "status": "warn",
            "message": "NOSUCH_KEY is not set: agents on the default provider nosuch cannot run"}
    finally:
        d.stop()


def test_doctor_judges_the_running_daemons_own_address(tmp_path: Path) -> None:
    home = make_home(tmp_path)  # config.toml keeps the default api_listen, 127.0.0.1:4200
    d = Daemon(home).start()  # listening where its AGENTD_LISTEN says
    try:
        r = run_cli(home, "doctor", "--json")  # a shell without AGENTD_LISTEN
    finally:
        d.stop()
    checks = {c["check"]: c for c in json.loads(r.stdout)}
    assert checks["daemon"]["message"].startswith(f"running at http://127.0.0.1:{d.port} ")
    assert checks["exposure"] == {"check": "exposure", "status": "ok",
                                  "message": f"listening on loopback (127.0.0.1:{d.port})"}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_doctor_names_each_cron_webhook_whose_secret_a_start_would_not_find(tmp_path: Path, backend: str) -> None:
    home = make_home(tmp_path)
    database = {"AGENTD_DATABASE_URL": pgtest.databases().new_url()} if backend == "postgres" else {}
    d = Daemon(home, env_extra={"CRON_DOCTOR_SECRET": "s3cret-value", "CRON_OTHER_SECRET": "other", **database}).start()
    try:
        r = d.post("/api/agents", json={"manifest_toml": 'name = "doc"\n'})
        assert r.status_code == 201, r.text
        # Made out of name order: doctor names them in name order.
        for name, variable in (("weekly", "CRON_OTHER_SECRET"), ("nightly report", "CRON_DOCTOR_SECRET")):
            r = d.post("/api/cron/jobs", json={
                "name": name, "agent_id": "doc", "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
                "action": {"kind": "agent_turn", "message": "m"},
                "delivery": {"kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret_env": variable}})
            assert r.status_code == 201, r.text
    finally:
        d.stop()

    def webhooks(**env: str) -> dict[str, str] | None:
        r = run_cli(home, "doctor", "--json", env_extra={**database, **env})
        return {c["check"]: c for c in json.loads(r.stdout)}.get("cron_webhooks")

    secrets = home / "secrets.env"
    assert webhooks(CRON_OTHER_SECRET="other") == {
        "check": "cron_webhooks", "status": "warn",
        "message": f"cron job nightly report: secret_env CRON_DOCTOR_SECRET is set neither in the environment "
                   f"nor in {secrets}: every delivery of its webhook fails"}
    both = webhooks()
    assert both == {"check": "cron_webhooks", "status": "warn", "message": "; ".join(
        f"cron job {name}: secret_env {variable} is set neither in the environment nor in {secrets}: every "
        "delivery of its webhook fails" for name, variable in (("nightly report", "CRON_DOCTOR_SECRET"),
                                                                 ("weekly", "CRON_OTHER_SECRET")))}
    assert "s3cret-value" not in json.dumps(both)
    # A start loads secrets.env: a variable there is held.
    secrets.write_text("CRON_DOCTOR_SECRET=from-the-file\n")
    secrets.chmod(0o600)
    assert webhooks(CRON_OTHER_SECRET="other") == {
        "check": "cron_webhooks", "status": "ok", "message": "the secret_env of 2 cron webhook(s) is set"}


def test_doctor_tells_a_readable_secrets_file_and_proxies_without_a_key(tmp_path: Path) -> None:
    """secrets.env that others than its owner may read, and trusted proxies whose clients
    (remote, all of them) no key serves: warnings naming what to do."""
    home = make_home(tmp_path, FAST_API.replace("[api]\n", '[api]\ntrusted_proxies = ["127.0.0.1", "10.0.0.0/8"]\n', 1))
    secrets = home / "secrets.env"
    secrets.write_text("OPENAI_API_KEY=sk-doctor\n")

    def checks(mode: int, **env: str) -> tuple[dict | None, dict | None]:
        secrets.chmod(mode)
        found = {c["check"]: c for c in json.loads(run_cli(home, "doctor", "--json", env_extra=env).stdout)}
        return found.get("secrets_file"), found.get("trusted_proxies")

    assert checks(0o604) == (
        {"check": "secrets_file", "status": "warn", "message": f"{secrets} has mode 0o604; run chmod 600 {secrets}"},
        {"check": "trusted_proxies", "status": "warn",
         "message": "trusted_proxies is set (127.0.0.1, 10.0.0.0/8) but api_key is not: clients behind the proxy "
                    "are remote and get 401; set api_key (or AGENTD_API_KEY)"})
    assert checks(0o640, AGENTD_API_KEY="k")[0]["message"] == f"{secrets} has mode 0o640; run chmod 600 {secrets}"
    assert checks(0o600, AGENTD_API_KEY="k") == (
        {"check": "secrets_file", "status": "ok", "message": f"{secrets} is private (0600)"},
        {"check": "trusted_proxies", "status": "ok",
         "message": "forwarding headers trusted from 127.0.0.1, 10.0.0.0/8; api_key is set"})
    secrets.unlink()
    (home / "config.toml").write_text(FAST_API)
    names = {c["check"] for c in json.loads(run_cli(home, "doctor", "--json").stdout)}
    assert "config" in names and names.isdisjoint({"secrets_file", "trusted_proxies"})
