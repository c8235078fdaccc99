"""`agentd doctor`'s provider key check (agentd/cli/doctor.py): the running daemon's keys,
else what a start would load."""

from __future__ import annotations

import json
from pathlib import Path

from support import FAST_API, Daemon, make_home, run_cli


def provider_keys(home: Path, port: int) -> dict[str, str]:
    # The CLI's own environment never has the key: only the daemon (or its home) may.
    r = run_cli(home, "doctor", "--json", port=port, env_extra={"ANTHROPIC_API_KEY": ""})
    return {c["check"]: c for c in json.loads(r.stdout)}["provider_keys"]


def test_doctor_asks_the_daemon_for_its_keys_then_reads_the_home(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    d = Daemon(home, env_extra={"ANTHROPIC_API_KEY": ""}).start()
    try:
        check = provider_keys(home, d.port)
        assert check["status"] == "warn" and "the daemon has no ANTHROPIC_API_KEY" in check["message"]
        assert "/api/providers/anthropic/key" in check["message"]
        r = d.post("/api/providers/anthropic/key", json={"api_key": "sk-ant-doctor"})
        assert r.status_code == 200, r.text
        d.post("/api/providers/groq/key", json={"api_key": "gsk-doctor"})
        check = provider_keys(home, d.port)
        assert check == {"check": "provider_keys", "status": "ok",
                         "message": "the daemon has ANTHROPIC_API_KEY for anthropic; "
                                    "it also has keys for groq"}, check
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
    finally:
        d.stop()
    assert check == {"check": "provider_keys", "status": "warn",
                     "message": "ANTHROPIC_API_KEY is not set: agents on the default provider anthropic cannot run "
                                f"(the daemon at http://127.0.0.1:{d.port} did not say which keys it holds: "
                                "give the CLI its API key, AGENTD_API_KEY)"}, check


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


def test_doctor_names_each_cron_webhook_whose_secret_a_start_would_not_find(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    d = Daemon(home, env_extra={"CRON_DOCTOR_SECRET": "s3cret-value", "CRON_OTHER_SECRET": "other"}).start()
    try:
        r = d.post("/api/agents", json={"manifest_toml": 'name = "doc"\n'})
        assert r.status_code == 201, r.text
        for name, variable in (("nightly report", "CRON_DOCTOR_SECRET"), ("weekly", "CRON_OTHER_SECRET")):
            r = d.post("/api/cron/jobs", json={
                "name": name, "agent_id": "doc", "schedule": {"kind": "cron", "expr": "0 0 1 1 *"},
                "action": {"kind": "agent_turn", "message": "m"},
                "delivery": {"kind": "webhook", "url": "http://127.0.0.1:9/hook", "secret_env": variable}})
            assert r.status_code == 201, r.text
    finally:
        d.stop()

    def webhooks(**env: str) -> dict[str, str] | None:
        r = run_cli(home, "doctor", "--json", env_extra=env)
        return {c["check"]: c for c in json.loads(r.stdout)}.get("cron_webhooks")

    secrets = home / "secrets.env"
    assert webhooks(CRON_OTHER_SECRET="other") == {
        "check": "cron_webhooks", "status": "warn",
        "message": f"cron job nightly report: secret_env CRON_DOCTOR_SECRET is set neither in the environment "
                   f"nor in {secrets}: every delivery of its webhook fails"}
    both = webhooks()
    assert both is not None and both["message"].count("cron job ") == 2 and "cron job weekly: " in both["message"]
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
