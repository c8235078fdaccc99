"""Options the CLI cannot send are refused with a message before any daemon is asked: no
traceback, and nothing the user typed is dropped without a word. Output into a pipe its
reader closed ends the command quietly."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import agentd_env, make_home, run_cli


@pytest.mark.parametrize("words, option", [
    (["budget", "--set", "nan"], "-s/--set-limit/--set"),
    (["budget", "--set", "inf"], "-s/--set-limit/--set"),
    (["budget", "--set", "ten"], "-s/--set-limit/--set"),
    (["cron", "add", "j", "--agent", "a", "--every", "60", "--message", "m", "--max-cost-usd-per-day", "inf"],
     "--max-cost-usd-per-day"),
])
def test_an_amount_of_usd_is_a_finite_number(tmp_path: Path, words: list[str], option: str) -> None:
    done = run_cli(make_home(tmp_path), *words)
    value = words[-1]
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(
        f"error: argument {option}: {value!r} is not an amount of USD (a number such as 25 or 0.5)")


@pytest.mark.parametrize("extra, message", [
    (["--every", "60", "--tz", "Europe/Paris"], "--tz goes with --cron or --at"),
    (["--every", "60", "--input", "go"], "--input goes with --workflow"),
    (["--every", "60", "--secret-env", "HOOK_SECRET"], "--secret-env goes with --webhook"),
    (["--every", "60", "--chat-id", "42"], "--chat-id goes with --channel"),
    (["--every", "60", "--workflow", "flow"], "give --message (an agent turn) or --workflow, not both"),
    (["--every", "60", "--webhook", "https://example.com/h", "--channel", "telegram"],
     "give at most one of --webhook, --channel"),
])
def test_cron_add_refuses_an_option_it_would_not_send(tmp_path: Path, extra: list[str], message: str) -> None:
    done = run_cli(make_home(tmp_path), "cron", "add", "j", "--agent", "a", "--message", "m", *extra)
    assert (done.returncode, done.stderr) == (1, f"error: {message}\n")


def test_a_reader_that_leaves_early_ends_the_command_without_a_traceback(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # as `agentd doctor --json | head -1` once head has its line
    try:
        done = subprocess.run([sys.executable, "-m", "agentd", "doctor", "--json"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=agentd_env(make_home(tmp_path)), timeout=60)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (1, "")


def test_doctor_lines_up_its_messages(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    # A daemon.json nobody answers for: the longest check name, stale_daemon_file, is listed.
    (home / "daemon.json").write_text('{"listen_addr": "127.0.0.1:9", "pid": 999999999, "started_at": ""}')
    lines = run_cli(home, "doctor").stdout.splitlines()
    assert any(" stale_daemon_file " in line for line in lines)
    columns = {re.match(r"\[\w+ *\] \w+ +", line).end() for line in lines}
    assert len(columns) == 1, lines
