"""The `agentd` command line (argh): start, stop, status, doctor, init."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import argh

from agentd.cli.client import ApiClient, find_daemon, process_identity, read_daemon_file
from agentd.config import Config, home_dir, load_config, unwritable_home, write_default_config
from agentd.errors import AgentdError
from agentd.money import format_usd

if TYPE_CHECKING:  # requests loads in the commands that talk to a daemon, not in `start`
    import requests


def _fail(message: str, code: int = 1) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _config() -> Config:
    try:
        return load_config()
    except AgentdError as exc:
        _fail(exc.message)
        raise  # unreachable; keeps type checkers calm


def usd(text: str) -> float:
    """An option's amount of US dollars: a finite number (nan and inf cannot be sent as JSON)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount of USD (a number such as 25 or 0.5)")
    return value


def _client(config: Config) -> ApiClient:
    info = find_daemon(config)
    if info is None:
        _fail(f"agentd is not running (no live daemon for {config.daemon_file})")
    return ApiClient(info.base_url, config.api_key)


def start() -> None:
    """Start the daemon in the foreground (Ctrl-C or `agentd stop` ends it)."""
    from agentd.daemon import run_daemon

    _write_home()
    config = _config()
    try:
        run_daemon(config)
    except AgentdError as exc:
        _fail(exc.message)
    # Shutdown is complete: the server is closed, the database closed and daemon.json
    # removed. Leave without interpreter finalization, where native libraries' static
    # destructors (the embedding runtime's threads) can race leftover daemon threads and
    # abort the process ("terminate called without an active exception", exit -6).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


STOP_WAIT_SECS = 5.0


def stop() -> None:
    """Stop the running daemon: graceful first, forced once its `shutdown_grace_secs` and 5 s
    more have passed."""
    config = _config()
    info = read_daemon_file(config.daemon_file)
    if info is None:
        _fail("agentd is not running (no daemon.json)")
    import requests

    client = ApiClient(info.base_url, config.api_key, timeout=5)
    try:
        # `home`: the daemon now at the recorded address may serve another home (this
        # daemon.json is stale); it refuses, and is left running.
        response = client.request("POST", "/api/shutdown", params={"home": str(config.home)})
        asked, answered = response.ok, True
        if response.status_code == 409:
            config.daemon_file.unlink(missing_ok=True)
            _fail(f"agentd was not running (removed stale daemon.json): the daemon at {info.base_url} "
                  "serves another home")
        if not asked:
            print(f"shutdown request refused: HTTP {response.status_code} {response.text.strip()}",
                  file=sys.stderr)
    except requests.RequestException:
        asked, answered = False, False
    # Signals go only to the very process that wrote daemon.json: pids are reused, and a
    # command line proves nothing (any program may mention agentd in its own).
    ours = bool(info.process) and process_identity(info.pid) == info.process
    if not answered and not ours:
        # Nothing answers at the address and the pid is not the daemon's process: a stale
        # daemon.json, and nothing of ours to stop.
        config.daemon_file.unlink(missing_ok=True)
        _fail("agentd was not running (removed stale daemon.json)")
    if not asked and ours:
        try:
            os.kill(info.pid, signal.SIGTERM)  # the API refused (no key?): the signal is graceful too
        except OSError:
            pass
    # The daemon gives requests under way its grace period before it closes what the tools
    # started; forced sooner, it would leave that behind. Each look is bounded by the time
    # left: a hung daemon accepts connections but never answers.
    deadline = time.monotonic() + config.api.shutdown_grace_secs + STOP_WAIT_SECS
    while True:
        left = deadline - time.monotonic()
        if find_daemon(config, timeout=max(0.1, left)) is None and not (ours and _pid_alive(info.pid)):
            config.daemon_file.unlink(missing_ok=True)
            print("agentd stopped")
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if not ours:
        _fail(f"agentd at {info.base_url} did not stop, and pid {info.pid} cannot be confirmed as the "
              "process that wrote daemon.json: nothing was killed")
    if _pid_alive(info.pid):
        try:
            os.kill(info.pid, signal.SIGKILL)
        except OSError as exc:
            _fail(f"cannot kill pid {info.pid}: {exc}")
        config.daemon_file.unlink(missing_ok=True)
        print("agentd stopped (forced)")
        return
    config.daemon_file.unlink(missing_ok=True)
    print("agentd stopped")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists"; /proc tells the truth on Linux.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


@argh.arg("--json", dest="as_json", help="print the raw JSON body")
def status(as_json: bool = False) -> None:
    """Show the running daemon's status and agents."""
    config = _config()
    response = _client(config).request("GET", "/api/status")
    if not response.ok:
        _fail(f"status request failed: HTTP {response.status_code} {response.text.strip()}")
    body = response.json()
    if as_json:
        print(json.dumps(body, indent=2))
        return
    rows = [("status", body["status"]), ("listening", body["api_listen"]),
            ("uptime", f"{body['uptime_seconds']} s"), ("home", body["home_dir"]),
            ("default model", f"{body['default_provider']}/{body['default_model']}"),
            ("log level", body["log_level"]), ("agents", str(body["agent_count"]))]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    if body["agents"]:
        print()
        print(_table(["NAME", "ID", "STATE", "MODE", "MODEL"],
                     [[a["name"], a["id"], a["state"], a["mode"],
                       f"{a['model_provider']}/{a['model_name']}"] for a in body["agents"]]))


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


@argh.arg("--json", dest="as_json", help="print the checks as JSON")
def doctor(as_json: bool = False) -> None:
    """Check the installation; exits non-zero when any check fails."""
    from agentd.cli.doctor import run_checks

    checks = run_checks(home_dir())
    if as_json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"[{c.status:4}] {c.name:{width}} {c.message}")
    if any(c.status == "fail" for c in checks):
        raise SystemExit(1)


@argh.arg("--json", dest="as_json", help="print the raw JSON")
@argh.arg("--since", help="ISO 8601 start (default: start of this month, UTC)")
@argh.arg("--until", help="ISO 8601 end (default: end of this month)")
def usage(as_json: bool = False, since: str = "", until: str = "") -> None:
    """Token and cost totals for the period, and per model."""
    client = _client(_config())
    params = {k: v for k, v in (("since", since), ("until", until)) if v}
    totals = _get(client, "/api/usage", params)
    models = _get(client, "/api/usage/by-model", params)
    if as_json:
        print(json.dumps({"totals": totals, "by_model": models}, indent=2))
        return
    print(f"period      {totals['period_start']} .. {totals['period_end']}")
    print(f"tokens      {totals['total_input_tokens']} in / {totals['total_output_tokens']} out")
    print(f"cost        ${totals['total_cost_usd']:.6f}")
    if models:
        print()
        print(_table(["MODEL", "REQUESTS", "INPUT", "OUTPUT", "COST USD"],
                     [[m["model"], m["requests"], m["input_tokens"], m["output_tokens"],
                       f"{m['cost_usd']:.6f}"] for m in models]))


@argh.arg("--set", dest="set_limit", type=usd, help="set the monthly limit in USD (0 = unlimited)")
@argh.arg("--json", dest="as_json", help="print the raw JSON")
def budget(set_limit: float | None = None, as_json: bool = False) -> None:
    """Show the monthly budget, or set it with --set."""
    client = _client(_config())
    if set_limit is not None:
        response = client.request("PUT", "/api/budget", json={"limit_usd": set_limit})
        if not response.ok:
            _fail(f"cannot set budget: {response.json().get('error', response.text)}")
    status = _get(client, "/api/budget")
    agents = _get(client, "/api/budget/agents")
    if as_json:
        print(json.dumps({"budget": status, "agents": agents}, indent=2))
        return
    limit = status["limit_usd"]
    print(f"limit       {format_usd(limit) if status.get('limited', limit > 0) else 'unlimited'}")
    print(f"spent       ${status['spent_usd']:.6f}")
    if status.get("limited", limit > 0):
        print(f"remaining   ${status['remaining_usd']:.6f}")
    print(f"period      {status['period_start']} .. {status['period_end']}")
    for alert in status["alerts"]:
        print(f"alert       [{alert['level']}] {alert['message']} ({alert['at']})")
    if agents:
        print()
        print(_table(["AGENT", "SPENT USD", "INPUT", "OUTPUT"],
                     [[a["agent_name"], f"{a['spent_usd']:.6f}", a["input_tokens"], a["output_tokens"]]
                      for a in agents]))


def _get(client: ApiClient, path: str, params: dict[str, str] | None = None) -> Any:
    response = client.request("GET", path, params=params)
    if not response.ok:
        _fail(f"GET {path} failed: HTTP {response.status_code} {response.text.strip()}")
    return response.json()


def _write_home() -> Path:
    """Create the home layout and its config.toml (kept if present), or exit 1 saying why the
    home cannot be one (a file is in its place, a read-only file system)."""
    home = home_dir()
    if home.exists() and not home.is_dir():
        _fail(f"{home} is not a directory: set AGENTD_HOME to a directory")
    try:
        return write_default_config(home)
    except OSError as exc:
        _fail(unwritable_home(home, exc))


def init() -> None:
    """Create the home directory and a commented config.toml (kept if present)."""
    existed = (home_dir() / "config.toml").exists()
    path = _write_home()
    print(f"{'kept existing' if existed else 'wrote'} {path}")


# Taken while the names are still the functions: importing the submodule agentd.cli.doctor
# (the doctor command does) rebinds this package's name `doctor` to that module.
COMMANDS = (start, stop, status, doctor, init, usage, budget)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `agentd` console script."""
    parser = argh.ArghParser(prog="agentd", description="agentd: a local daemon for LLM agents")
    # Each help text says its own default where there is one; argh's formatter would append
    # the raw value as well ("(default: '')" after "default: start of this month").
    plain = {"formatter_class": argparse.RawDescriptionHelpFormatter}
    parser.add_commands(list(COMMANDS), func_kwargs=plain)
    from agentd.cli.workflow import COMMANDS as workflow_commands

    parser.add_commands(workflow_commands, func_kwargs=plain,
                        group_name="workflow",
                        group_kwargs={"title": "Create, list, run and delete workflows",
                                      "help": "create, list and run workflows (agentd workflow --help)"})
    from agentd.cli.cron import COMMANDS as cron_commands

    parser.add_commands(cron_commands, func_kwargs=plain, group_name="cron",
                        group_kwargs={"title": "Add, list, run, pause, resume and remove cron jobs",
                                      "help": "list, add, run, pause, resume and remove cron jobs (agentd cron --help)"})
    words = sys.argv[1:] if argv is None else argv
    if not words or words in (["workflow"], ["cron"]):
        # A command is missing: say which ones there are, and fail as argparse does for a bad one.
        with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
            parser.parse_args([*words, "--help"])
        raise SystemExit(2)
    try:
        parser.dispatch(argv=argv)
    except BrokenPipeError:
        # The reader left early (`agentd usage --json | head`): stop quietly, as other tools do.
        # Python would flush stdout into the closed pipe again at exit; point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
