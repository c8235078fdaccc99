"""process_* through the real daemon: the fake LLM calls the tools, the programs really run."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, run_cli, stop_shared, wait_until
from tests.agents.tools.tool_calls import alive, call, spawn

# Prints the variables beyond what a program needs (none expected) and whether PATH is there.
ENV_CHECK = ("import os; keep = {'PATH', 'HOME', 'LANG', 'LANGUAGE', 'TERM', 'TZ', 'USER', 'LOGNAME', 'SHELL', "
             "'TMPDIR'}; print(sorted(k for k in os.environ if k not in keep and not k.startswith('LC_')), "
             "'PATH' in os.environ)")
LIMITS = "\n[tools]\nprocess_max_per_agent = 2\nprocess_buffer_bytes = 64\nprocess_max_runtime_secs = 30\n"


@pytest.fixture(scope="module")
def pd(tmp_path_factory, fake_llm):
    home = make_home(tmp_path_factory.mktemp("proc"), llm_config(fake_llm, LIMITS))
    daemon = Daemon(home, env_extra={**LLM_ENV, "AGENTD_TEST_SECRET": "s3cret"}).start()
    yield daemon
    stop_shared(daemon)


def test_start_write_poll_list_kill(pd) -> None:
    agent = spawn(pd)
    started = json.loads(call(pd, agent, "process_start", command="cat"))
    pid, proc_id = started["pid"], started["process_id"]
    assert started["command"] == "cat" and alive(pid)
    assert call(pd, agent, "process_write", process_id=proc_id, data="hello") == f"wrote 6 bytes to {proc_id}"
    seen = []

    def echoed() -> bool:
        seen.append(json.loads(call(pd, agent, "process_poll", process_id=proc_id)))
        return "".join(p["output"] for p in seen) == "hello\n"
    wait_until(echoed, "cat echoes what process_write sent")
    assert seen[-1]["alive"] is True and seen[-1]["exit_code"] is None
    # A poll returns only what came since the last one.
    assert json.loads(call(pd, agent, "process_poll", process_id=proc_id))["output"] == ""
    listed = json.loads(call(pd, agent, "process_list"))
    assert [(p["process_id"], p["pid"], p["command"], p["alive"]) for p in listed] == [(proc_id, pid, "cat", True)]
    assert call(pd, agent, "process_kill", process_id=proc_id).startswith(f"process {proc_id} killed")
    assert not alive(pid)
    assert json.loads(call(pd, agent, "process_list")) == []
    events = [e["event"] for e in pd.get("/api/audit/recent?limit=50").json()
              if (e.get("detail") or {}).get("agent_id") == agent]
    assert {"tool.process_start", "tool.process_write", "tool.process_kill"} <= set(events)


def test_writing_to_a_program_that_does_not_read_gives_up(pd) -> None:
    agent = spawn(pd)
    # A whole command line with empty `args` is split as when `args` is left out.
    started = json.loads(call(pd, agent, "process_start", command="sleep 60", args=[]))
    assert started["command"] == "sleep 60"
    proc_id = started["process_id"]
    # The pipe takes the first write whole; the second finds it full.
    data = "x" * 60_000
    assert call(pd, agent, "process_write", process_id=proc_id, data=data) == f"wrote 60001 bytes to {proc_id}"
    begun = time.monotonic()
    refused = call(pd, agent, "process_write", process_id=proc_id, data=data)
    assert time.monotonic() - begun < 10
    assert refused.startswith(f"error: process {proc_id} took ") and \
        refused.endswith(" of 60001 bytes within 5s: it is not reading its input"), refused
    assert call(pd, agent, "process_kill", process_id=proc_id).startswith(f"process {proc_id} killed")


def test_ring_buffer_keeps_the_newest_bytes_and_counts_the_rest(pd) -> None:
    agent = spawn(pd)
    started = json.loads(call(pd, agent, "process_start", command="python3",
                              args=["-c", "print('x' * 100 + 'END')"]))

    polls: list[dict] = []

    def done() -> bool:
        polls.append(json.loads(call(pd, agent, "process_poll", process_id=started["process_id"])))
        return not polls[-1]["alive"]
    wait_until(done, "the program exits")
    assert polls[-1]["exit_code"] == 0
    # One write of 104 bytes into a 64-byte ring: the newest 64 are kept.
    assert "".join(p["output"] for p in polls) == "x" * 60 + "END\n"
    assert sum(p.get("dropped_bytes", 0) for p in polls) == 40


def test_policy_limits_and_scrubbed_environment(pd) -> None:
    agent = spawn(pd)
    assert call(pd, agent, "process_start", command="sudo", args=["id"]) == \
        "error: 'sudo' is denied by the daemon's shell policy"
    assert call(pd, agent, "process_start", command="sh", args=["-c", "su root"]) == \
        "error: 'su' is denied by the daemon's shell policy"
    # A whole command line in `command` is split without a shell, under the same checks.
    assert call(pd, agent, "process_start", command="nice sudo id") == \
        "error: 'sudo' is denied by the daemon's shell policy"
    assert call(pd, agent, "process_start", command="sleep 1 | cat") == \
        "error: shell metacharacter '|' is not allowed: commands run without a shell (one program with its arguments)"
    nul = "error: the command contains a NUL character (\\u0000), which no program argument can hold"
    assert call(pd, agent, "process_start", command="echo", args=["a\0b"]) == nul
    assert call(pd, agent, "process_start", command="echo a\0b") == nul
    env = json.loads(call(pd, agent, "process_start", command="python3", args=["-c", ENV_CHECK]))
    wait_until(lambda: not alive(env["pid"]), "the program exits")
    output = json.loads(call(pd, agent, "process_poll", process_id=env["process_id"]))["output"]
    assert output == "['AGENTD_PROCESS'] True\n", "BUG: a program started by a tool sees the daemon's secrets"
    first = json.loads(call(pd, agent, "process_start", command="sleep 30"))
    assert first["command"] == "sleep 30"
    second = json.loads(call(pd, agent, "process_start", command="sleep", args=["30"]))
    assert call(pd, agent, "process_start", command="sleep", args=["30"]) == \
        "error: this agent already runs 2 processes (the limit is 2): kill one with process_kill first"
    other = spawn(pd)
    assert call(pd, other, "process_poll", process_id=first["process_id"]) == \
        f"error: no process {first['process_id']!r} for this agent (see process_list)"
    # A program that left its process group, started by one that exited.
    call(pd, agent, "process_kill", process_id=second["process_id"])
    seconds = f"303.{os.getpid()}"  # (a command line no other test run shares)
    escaped = json.loads(call(pd, agent, "process_start", command="setsid", args=["sleep", seconds]))
    wait_until(lambda: _named(f"sleep {seconds}"), "the program in a session of its own runs")
    runaway = _named(f"sleep {seconds}")[0]
    assert not alive(escaped["pid"]) and os.getsid(runaway) == runaway
    # Killing the agent ends its programs.
    assert pd.delete(f"/api/agents/{agent}").status_code == 200
    wait_until(lambda: not alive(first["pid"]) and not alive(runaway), "the killed agent's programs end")


def test_memory_limit_applies(pd) -> None:
    agent = spawn(pd)
    started = json.loads(call(pd, agent, "process_start", command="python3",
                              args=["-c", "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"]))
    wait_until(lambda: not alive(started["pid"]), "the program exits")
    polled = json.loads(call(pd, agent, "process_poll", process_id=started["process_id"]))
    assert polled["output"] == f"{1024 * 1024 * 1024}\n"


def test_without_shell_grant_the_tools_are_not_offered(pd) -> None:
    agent = spawn(pd, extra="")
    r = pd.post(f"/api/agents/{agent}/message", json={"message": '[[tool:process_start {"command": "sleep"}]]'})
    assert "permission denied: tool 'process_start' is not available" in r.json()["response"]


def test_observe_mode_offers_only_poll_and_list(pd) -> None:
    agent = spawn(pd)
    assert pd.put(f"/api/agents/{agent}/mode", json={"mode": "Observe"}).status_code == 200
    r = pd.post(f"/api/agents/{agent}/message", json={"message": '[[tool:process_start {"command": "sleep"}]]'})
    assert "permission denied: tool 'process_start' is not available" in r.json()["response"]
    assert call(pd, agent, "process_list") == "[]"


def test_manual_mode_asks_before_a_program_starts(pd) -> None:
    agent = spawn(pd)
    assert pd.put(f"/api/agents/{agent}/mode", json={"mode": "Manual"}).status_code == 200
    answer: dict = {}
    asking = threading.Thread(target=lambda: answer.update(text=call(pd, agent, "process_start", command="sleep 67.25")))
    asking.start()
    pending: list = []
    wait_until(lambda: pending.extend(a for a in pd.get("/api/approvals").json() if a["agent_id"] == agent)
               or pending, "the approval request")
    assert (pending[0]["tool"], pending[0]["input"]) == ("process_start", {"command": "sleep 67.25"})
    assert not any("sleep 67.25" in _cmdline(p) for p in _pids()), "BUG: the program started before approval"
    assert pd.post(f"/api/approvals/{pending[0]['id']}/reject").status_code == 200
    asking.join(30)
    assert answer["text"] == ("denied: the call to 'process_start' was not performed because a human rejected it.")
    assert not any("sleep 67.25" in _cmdline(p) for p in _pids())
    assert pd.put(f"/api/agents/{agent}/mode", json={"mode": "Auto"}).status_code == 200
    assert call(pd, agent, "process_list") == "[]"


@pytest.mark.parametrize("how", ["sigterm", "agentd stop"])
def test_no_program_outlives_the_daemon(tmp_path, fake_llm, how) -> None:
    home = make_home(tmp_path / "h", llm_config(fake_llm))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    agent = spawn(daemon)
    started = json.loads(call(daemon, agent, "process_start", command="sleep", args=["300"]))
    # A grandchild in the same process group ends too.
    tree = json.loads(call(daemon, agent, "process_start", command="sh", args=["-c", "sleep 301 & wait"]))
    wait_until(lambda: any("sleep 301" in _cmdline(p) for p in _pids()), "the grandchild runs")
    grandchild = next(p for p in _pids() if "sleep 301" in _cmdline(p))
    assert alive(started["pid"]) and alive(tree["pid"])
    # One that left the process group for a session of its own ends too.
    seconds = f"304.{os.getpid()}"  # (a command line no other test run shares)
    call(daemon, agent, "process_start", command="setsid", args=["sleep", seconds])
    wait_until(lambda: _named(f"sleep {seconds}"), "the program in a session of its own runs")
    runaway = _named(f"sleep {seconds}")[0]
    if how == "sigterm":
        assert daemon.stop() == 0
    else:
        done = run_cli(home, "stop", port=daemon.port)
        assert done.returncode == 0, done.stdout + done.stderr
        daemon.proc.wait(15)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in (started["pid"], tree["pid"], grandchild, runaway)):
        time.sleep(0.05)
    assert not any(alive(p) for p in (started["pid"], tree["pid"], grandchild, runaway)), \
        "BUG: a program started with process_start outlived the daemon"
    assert daemon.problems() == []


def _named(command: str) -> list[int]:
    return [p for p in _pids() if _cmdline(p).strip() == command]


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
