"""process_* through the real daemon: the fake LLM calls the tools, the programs really run.
Then the process table's limits, buffers, run time, kills and stop in process (the same tools on
the daemon's real tool services, real programs), where the timing can be exact."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from agentd.agents.tools import ToolContext, ToolError, get_tool, validate_args
from agentd.agents.tools.processes import KEEP_EXITED, KILL_GRACE, WRITE_WAIT, Ring
from agentd.agents.tools.services import ToolServices
from agentd.config import ToolsConfig

from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, make_home, run_cli, stop_shared, wait_until
from tests.agents.tools.tool_calls import alive, call, spawn

# Prints the variables beyond what a program needs (none expected) and whether PATH is there.
ENV_CHECK = ("import os; keep = {'PATH', 'HOME', 'LANG', 'LANGUAGE', 'TERM', 'TZ', 'USER', 'LOGNAME', 'SHELL', "
             "'TMPDIR'}; print(sorted(k for k in os.environ if k not in keep and not k.startswith('LC_')), "
             "'PATH' in os.environ)")
LIMITS = "\n[tools]\nprocess_max_per_agent = 2\nprocess_buffer_bytes = 64\nprocess_max_runtime_secs = 30\n"


@pytest.fixture(scope="module")
def pd(tmp_path_factory, fake_llm):
    home = make_home(tmp_path_factory.mktemp("proc"), llm_config(fake_llm, LIMITS + NO_REMEMBERING))
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


def test_the_tool_offered_to_the_model_states_no_limit_the_configuration_may_change(pd, fake_llm) -> None:
    agent = spawn(pd)
    call(pd, agent, "process_list")
    # (The fake serves other tests' wire formats too: only OpenAI's tools have a `function`.)
    offered = [t["function"]["description"] for r in fake_llm.requests for t in (r["json"] or {}).get("tools") or []
               if (t.get("function") or {}).get("name") == "process_start"]
    # The daemon allows 2 programs (LIMITS): a number in the description could only be wrong.
    assert offered and not any(c.isdigit() for c in offered[-1]), offered[-1]


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


@pytest.mark.parametrize("how", ["sigterm", "agentd stop", "agentd stop mid-call"])
def test_no_program_outlives_the_daemon(tmp_path, fake_llm, how) -> None:
    # The default grace: a tool call still going holds the daemon's drain longer than
    # `agentd stop` waits before it forces the stop.
    home = make_home(tmp_path / "h", llm_config(fake_llm, NO_REMEMBERING + '[tools]\nfetch_allow_hosts = ["127.0.0.1"]\n'
                                                ).replace("shutdown_grace_secs = 5", "shutdown_grace_secs = 10"))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    agent = spawn(daemon, '[capabilities]\nshell = ["*"]\nnetwork = ["*"]\n')
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
    if how == "agentd stop mid-call":
        # A fetch from a server that never answers: a call the run's stop does not end.
        silent = socket.create_server(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/never"
        def fetch() -> None:
            with contextlib.suppress(requests.RequestException):  # (the daemon goes away under it)
                daemon.post(f"/api/agents/{agent}/message",
                            json={"message": f'[[tool:web_fetch {{"url": "{url}"}}]]'}, timeout=60)

        threading.Thread(target=fetch, daemon=True).start()
        silent.settimeout(30)
        held = silent.accept()[0]  # the call is under way, and waits for an answer
    if how == "sigterm":
        assert daemon.stop() == 0
    else:
        done = run_cli(home, "stop", port=daemon.port)
        assert (done.returncode, done.stdout.strip()) == (0, "agentd stopped"), done.stdout + done.stderr
        daemon.proc.wait(15)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in (started["pid"], tree["pid"], grandchild, runaway)):
        time.sleep(0.05)
    assert not any(alive(p) for p in (started["pid"], tree["pid"], grandchild, runaway)), \
        "BUG: a program started with process_start outlived the daemon"
    if how == "agentd stop mid-call":
        held.close()
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


# -- the process table in process: the same tools on a real ToolServices, the programs real --------

class Programs:
    """The daemon's tool services for one test (programs really run), and a context per agent."""

    def __init__(self, tmp_path: Path, **limits: Any) -> None:
        self.tmp_path = tmp_path
        self.audit: list[tuple[str, str, dict]] = []
        self.services = ToolServices(ToolsConfig(**limits), lambda *entry: self.audit.append(entry),
                                     lambda *a: {}, lambda *a, **k: {})
        self.table = self.services.processes

    def ctx(self, agent_id: str = "agent-1") -> ToolContext:
        return ToolContext(agent_id, self.tmp_path / agent_id, {"shell": ["*"]}, self.table.config,
                           services=self.services)

    def run(self, name: str, agent_id: str = "agent-1", **args: Any) -> str:
        tool = get_tool(name)
        validate_args(tool, args)
        return tool.run(self.ctx(agent_id), args)

    def start(self, *argv: str, agent_id: str = "agent-1") -> dict[str, Any]:
        return json.loads(self.run("process_start", agent_id, command=argv[0], args=list(argv[1:])))

    def poll(self, proc_id: str, agent_id: str = "agent-1") -> dict[str, Any]:
        return json.loads(self.run("process_poll", agent_id, process_id=proc_id))

    def ended(self, proc_id: str) -> dict[str, Any]:
        """Polls until the program has exited and its output is read; the last poll, the output joined."""
        polls = []
        wait_until(lambda: polls.append(self.poll(proc_id)) or not polls[-1]["alive"], "the program exits")
        wait_until(lambda: self.table.get("agent-1", proc_id).popen.stdout.closed, "its output is read")
        polls.append(self.poll(proc_id))
        return {**polls[-1], "output": "".join(p["output"] for p in polls),
                "dropped_bytes": sum(p.get("dropped_bytes", 0) for p in polls)}


@pytest.fixture()
def programs(tmp_path: Path) -> Iterator[Programs]:
    p = Programs(tmp_path, process_max_per_agent=3, process_buffer_bytes=10, process_max_memory_mb=64)
    yield p
    p.table.close()


def test_ring_keeps_the_newest_bytes_across_writes_and_counts_what_it_dropped() -> None:
    ring = Ring(5)
    ring.add(b"abc")
    ring.add(b"defg")
    assert (bytes(ring.data), ring.dropped) == (b"cdefg", 2)
    ring.add(b"hi")
    assert ring.take() == ("efghi", 4)
    assert ring.take() == ("", 0)
    ring.add(b"\xff12")
    assert ring.take() == ("\ufffd12", 0)
    ring.add(b"123456")   # one byte over
    assert ring.take() == ("23456", 1)


def test_a_program_runs_in_the_workspace_with_its_marker_and_memory_limit(programs: Programs) -> None:
    code = ("import os, resource; print(os.getcwd()); print(os.environ['AGENTD_PROCESS']); "
            "print(resource.getrlimit(resource.RLIMIT_AS)[0])")
    programs.table.config.process_buffer_bytes = 4096
    started = programs.start("python3", "-c", code)
    proc_id, pid = started["process_id"], started["pid"]
    assert started == {"process_id": proc_id, "pid": pid, "command": f"python3 -c {code}"}
    assert proc_id.startswith("proc-") and len(proc_id) == 13
    done = programs.ended(proc_id)
    assert done["output"] == (f"{(programs.tmp_path / 'agent-1').resolve()}\n{os.getpid()}:agent-1:{proc_id}\n"
                              f"{64 * 1024 * 1024}\n")
    assert (done["alive"], done["exit_code"], done["dropped_bytes"]) == (False, 0, 0) and "note" not in done
    assert programs.audit == [("tool.process_start", "agent-1",
                               {"agent_id": "agent-1", "process_id": proc_id, "command": "python3", "pid": pid})]


def test_a_poll_reports_output_dropped_from_a_small_buffer(programs: Programs) -> None:
    started = programs.start("python3", "-c", "print('0123456789abcdef')")
    done = programs.ended(started["process_id"])
    assert (done["output"], done["dropped_bytes"]) == ("789abcdef\n", 7)


def test_a_programs_error_output_is_read_with_its_output_in_order(programs: Programs) -> None:
    programs.table.config.process_buffer_bytes = 4096
    code = ("import sys; print('out 1', flush=True); print('err 1', file=sys.stderr, flush=True); "
            "print('out 2', flush=True); sys.exit('fatal: gone')")
    done = programs.ended(programs.start("python3", "-c", code)["process_id"])
    assert (done["output"], done["exit_code"]) == ("out 1\nerr 1\nout 2\nfatal: gone\n", 1)


def test_the_output_reader_never_holds_the_daemons_exit(programs: Programs) -> None:
    """A descendant that cleared its environment and left the group can hold the pipe open for
    good: the reader is a daemon thread (named for thread dumps)."""
    before = set(threading.enumerate())
    started = programs.start("sleep", "30")
    readers = [t for t in threading.enumerate() if t not in before and t.name.startswith("proc-")]
    assert [(t.name, t.daemon) for t in readers] == [(f"proc-{started['process_id']}", True)]


def test_the_list_shows_running_and_exited_programs_with_their_exit_codes(programs: Programs) -> None:
    running = programs.start("sleep", "30")
    failed = programs.start("sh", "-c", "exit 3")
    programs.ended(failed["process_id"])
    listed = json.loads(programs.run("process_list"))
    assert [(p["process_id"], p["command"], p["pid"], p["alive"], p["exit_code"]) for p in listed] == [
        (running["process_id"], "sleep 30", running["pid"], True, None),
        (failed["process_id"], "sh -c exit 3", failed["pid"], False, 3)]
    assert all(isinstance(p["uptime_secs"], float) and 0 <= p["uptime_secs"] < 30 for p in listed)
    time.sleep(0.25)
    uptimes = [p["uptime_secs"] for p in json.loads(programs.run("process_list"))]
    assert uptimes == [round(u, 1) for u in uptimes] and uptimes[0] >= 0.2, "seconds to one decimal"
    assert json.loads(programs.run("process_list", "agent-2")) == []
    with pytest.raises(ToolError) as err:
        programs.run("process_write", process_id=failed["process_id"], data="x")
    assert str(err.value) == f"process {failed['process_id']} has exited (code 3)"
    with pytest.raises(ToolError) as err:
        programs.run("process_poll", "agent-2", process_id=running["process_id"])
    assert str(err.value) == f"no process {running['process_id']!r} for this agent (see process_list)"


def test_an_exited_programs_uptime_stops_at_its_exit(programs: Programs) -> None:
    proc_id = programs.start("sleep", "0.3")["process_id"]
    programs.ended(proc_id)
    first = json.loads(programs.run("process_list"))[0]["uptime_secs"]
    time.sleep(0.5)
    assert json.loads(programs.run("process_list"))[0]["uptime_secs"] == first
    assert first >= 0.3


def test_exited_programs_do_not_count_toward_the_limit_and_the_oldest_are_forgotten(programs: Programs) -> None:
    exited = []
    for _ in range(KEEP_EXITED + 2):
        exited.append(programs.start("true")["process_id"])
        wait_until(lambda: not programs.table.get("agent-1", exited[-1]).alive(), "the program exits")
    running = [programs.start("sleep", "30")["process_id"] for _ in range(3)]
    with pytest.raises(ToolError) as err:
        programs.start("sleep", "30")
    assert str(err.value) == ("this agent already runs 3 processes (the limit is 3): kill one with "
                              "process_kill first")
    listed = [p["process_id"] for p in json.loads(programs.run("process_list"))]
    assert listed == exited[2:] + running, "the two oldest exited programs are forgotten, the rest stay"
    # Another agent has a limit of its own.
    assert programs.start("true", agent_id="agent-2")["command"] == "true"


def test_a_program_past_its_run_time_is_ended_with_a_note(tmp_path: Path) -> None:
    programs = Programs(tmp_path, process_max_runtime_secs=0.5)
    try:
        started = programs.start("sleep", "30")
        done = programs.ended(started["process_id"])
        assert (done["alive"], done["exit_code"], done["note"]) == (
            False, -signal.SIGTERM, "killed after 0.5s (the run time limit)")
        quick = programs.start("sleep", "0.1")
        assert "note" not in programs.ended(quick["process_id"])
        # A program it started that left the group ends with it.
        seconds = f"306.{os.getpid()}"
        tree = programs.start("sh", "-c", f"setsid sleep {seconds} & sleep 30")
        wait_until(lambda: _named(f"sleep {seconds}"), "the program in a session of its own runs")
        runaway = _named(f"sleep {seconds}")[0]
        assert programs.ended(tree["process_id"])["note"] == "killed after 0.5s (the run time limit)"
        wait_until(lambda: not alive(runaway), "the program that left the group ends")
    finally:
        programs.table.close()


def test_kill_ends_the_group_and_a_program_ignoring_sigterm_is_killed(programs: Programs) -> None:
    ignoring = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(60)")
    stubborn = programs.start("python3", "-c", ignoring)
    wait_until(lambda: programs.poll(stubborn["process_id"])["output"], "the program ignores SIGTERM")
    began = time.monotonic()
    said = programs.run("process_kill", process_id=stubborn["process_id"])
    assert said == f"process {stubborn['process_id']} killed (exit code {-signal.SIGKILL})"
    assert KILL_GRACE <= time.monotonic() - began < KILL_GRACE + 3 and not alive(stubborn["pid"])
    # The leader ends on SIGTERM; a child of its group that ignores it (and cleared its
    # environment, so nothing marks it as the program's) is killed straight after.
    tree = programs.start("sh", "-c", f"env -i {shutil.which('python3')} -c \"{ignoring}\" & wait")
    wait_until(lambda: programs.poll(tree["process_id"])["output"], "the child ignores SIGTERM")
    child = _group_members(tree["pid"])[0]
    began = time.monotonic()
    assert programs.run("process_kill", process_id=tree["process_id"]) == (
        f"process {tree['process_id']} killed (exit code {-signal.SIGTERM})")
    assert time.monotonic() - began < KILL_GRACE
    wait_until(lambda: not alive(child), "the child that ignored SIGTERM ends")
    assert [e[0] for e in programs.audit].count("tool.process_kill") == 2
    with pytest.raises(ToolError) as err:
        programs.poll(tree["process_id"])
    assert str(err.value).startswith(f"no process {tree['process_id']!r}")


def test_a_write_waits_for_a_slow_reader_and_gives_up_on_one_that_never_reads(programs: Programs) -> None:
    programs.table.config.process_buffer_bytes = 100
    slow = programs.start("python3", "-c", "import sys, time; time.sleep(1); print(len(sys.stdin.buffer.readline()))")
    data = "x" * 150_000   # more than a pipe holds: the rest goes in as the program reads
    assert programs.run("process_write", process_id=slow["process_id"], data=data) == (
        f"wrote 150001 bytes to {slow['process_id']}")
    assert programs.ended(slow["process_id"])["output"] == "150001\n"
    deaf = programs.start("sleep", "30")
    began = time.monotonic()
    with pytest.raises(ToolError) as err:
        programs.run("process_write", process_id=deaf["process_id"], data=data)
    assert WRITE_WAIT <= time.monotonic() - began < WRITE_WAIT + 0.9
    sent = int(str(err.value).split(" took ")[1].split(" ")[0])
    assert 0 < sent < 150_001 and str(err.value) == (
        f"process {deaf['process_id']} took {sent} of 150001 bytes within 5s: it is not reading its input")
    writes = [e[2] for e in programs.audit if e[0] == "tool.process_write"]
    assert writes == [{"agent_id": "agent-1", "process_id": slow["process_id"], "bytes": 150_001},
                      {"agent_id": "agent-1", "process_id": deaf["process_id"], "bytes": sent}]


def test_a_kill_ends_the_programs_runaways_and_no_other_program_of_the_agent(programs: Programs) -> None:
    seconds = f"307.{os.getpid()}"
    keep = programs.start("sleep", "30")
    tree = programs.start("sh", "-c", f"setsid sleep {seconds} & sleep 30")
    wait_until(lambda: _named(f"sleep {seconds}"), "the program in a session of its own runs")
    runaway = _named(f"sleep {seconds}")[0]
    programs.run("process_kill", process_id=tree["process_id"])
    wait_until(lambda: not alive(runaway), "the program that left the killed one's group ends")
    assert alive(keep["pid"]) and programs.poll(keep["process_id"])["alive"] is True


def test_a_program_past_its_run_time_takes_no_other_program_with_it(tmp_path: Path) -> None:
    programs = Programs(tmp_path, process_max_runtime_secs=2.0)
    try:
        timers = {t for t in threading.enumerate() if isinstance(t, threading.Timer)}
        first = programs.start("sleep", "30")
        wait_until(lambda: {t for t in threading.enumerate() if isinstance(t, threading.Timer)} - timers,
                   "the first program's run time is counted")
        expiry = ({t for t in threading.enumerate() if isinstance(t, threading.Timer)} - timers).pop()
        time.sleep(1.5)
        second = programs.start("sleep", "30")
        wait_until(lambda: not expiry.is_alive(), "the first program's run time ends and it is killed")
        assert not alive(first["pid"])
        assert alive(second["pid"]) and "note" not in programs.poll(second["process_id"])
    finally:
        programs.table.close()


def test_an_agents_release_ends_only_its_programs_even_those_that_left_the_group(programs: Programs) -> None:
    seconds = f"305.{os.getpid()}"
    mine = programs.start("sleep", "30")
    programs.start("setsid", "sleep", seconds)
    wait_until(lambda: _named(f"sleep {seconds}"), "the program in a session of its own runs")
    runaway = _named(f"sleep {seconds}")[0]
    theirs = programs.start("sleep", "30", agent_id="agent-2")
    programs.table.release("agent-1")
    wait_until(lambda: not alive(mine["pid"]) and not alive(runaway), "agent-1's programs end")
    assert alive(theirs["pid"]) and json.loads(programs.run("process_list")) == []
    assert [p["pid"] for p in json.loads(programs.run("process_list", "agent-2"))] == [theirs["pid"]]


def test_a_stopping_daemon_ends_every_program_and_starts_no_more(programs: Programs) -> None:
    one, two = programs.start("sleep", "30"), programs.start("sleep", "30", agent_id="agent-2")
    # A program that cleans up on SIGTERM is given the chance.
    graceful = programs.start("python3", "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: "
                              "(open('bye', 'w').write('bye'), sys.exit(0))); print('ready', flush=True); "
                              "time.sleep(30)")
    wait_until(lambda: programs.poll(graceful["process_id"])["output"], "the program handles SIGTERM")
    began = time.monotonic()
    programs.table.close()
    assert time.monotonic() - began < KILL_GRACE
    assert not alive(one["pid"]) and not alive(two["pid"]) and not alive(graceful["pid"])
    assert (programs.tmp_path / "agent-1" / "bye").read_text() == "bye"
    with pytest.raises(ToolError) as err:
        programs.start("sleep", "1")
    assert str(err.value) == "the daemon is stopping"


def test_a_program_that_cannot_start(programs: Programs) -> None:
    with pytest.raises(ToolError) as err:
        programs.start("no-such-program-here")
    assert str(err.value) == "program not found: no-such-program-here"
    script = programs.tmp_path / "agent-1" / "script.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(ToolError) as err:
        programs.start("./script.sh")
    assert str(err.value) == "permission denied running ./script.sh"
    assert json.loads(programs.run("process_list")) == [] and programs.audit == []


def _group_members(pgid: int) -> list[int]:
    members = []
    for pid in _pids():
        try:
            if pid != pgid and os.getpgid(pid) == pgid:
                members.append(pid)
        except OSError:
            pass
    return members
