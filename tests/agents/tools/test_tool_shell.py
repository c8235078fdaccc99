"""shell_exec's policy and output handling, value by value.

Near misses for every check that guards something: a denied program hidden behind a wrapper
at each position, wrapper arguments that only look like programs, the allowlist as `true`
or empty, and the output cap exactly at its edge across several pipe reads. Through the real
daemon: what a command started in a session of its own ends with the command.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agentd.agents.tools import ToolContext, ToolError
from agentd.agents.tools.shell import MARKER, _check, kill_marked
from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from support import Daemon, make_home, stop_shared
from tests.agents.tools.test_tools import make_ctx, run
from tests.agents.tools.tool_calls import alive, call, spawn

NUL_REFUSAL = "the command contains a NUL character (\\u0000), which no program argument can hold"
META_TAIL = ": commands run without a shell (one program with its arguments)"


def refusal(ctx: ToolContext, command: str) -> str:
    with pytest.raises(ToolError) as caught:
        run(ctx, "shell_exec", command=command)
    return str(caught.value)


@pytest.fixture()
def wide(tmp_path: Path) -> ToolContext:
    return make_ctx(tmp_path, shell=["*"])


def script(ctx: ToolContext, name: str, code: str) -> str:
    """Write a Python script into the workspace (commands cannot carry ';' themselves)."""
    run(ctx, "file_write", path=name, content=code)
    return f"python3 {name}"


def test_refusal_messages_are_exact(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["echo", "sleep"])
    assert refusal(ctx, "echo a; ls") == "shell metacharacter ';' is not allowed" + META_TAIL
    assert refusal(ctx, "") == "empty command"
    assert refusal(ctx, "   ") == "empty command"
    assert refusal(ctx, 'echo "open') == "cannot parse the command: No closing quotation"
    assert refusal(ctx, "ls -l") == "'ls' is not in this agent's shell allowlist (echo, sleep)"
    assert refusal(ctx, "sudo id") == "'sudo' is denied by the daemon's shell policy"
    assert refusal(ctx, "echo a\0b") == NUL_REFUSAL
    bare = make_ctx(tmp_path, shell=[])
    assert refusal(bare, "echo hi") == "'echo' is not in this agent's shell allowlist (empty)", \
        "BUG: an empty allowlist is not reported as empty"


def test_shell_capability_true_means_any_program(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=True)
    assert run(ctx, "shell_exec", command="echo any") == "exit code 0\nany\n", \
        "BUG: `shell = true` in a manifest does not allow every program"
    assert refusal(ctx, "sudo id") == "'sudo' is denied by the daemon's shell policy"


@pytest.mark.parametrize("command", ["nice sudo id", "nice -n 5 sudo id", "timeout 5 /usr/bin/sudo id",
                                     "env A=1 B=2 su root",
                                     # a shell runs its -c argument: every word of it counts
                                     'sh -c "sudo id"', "bash -c 'FOO=1 sudo id'", 'sh -c "env sudo id"',
                                     '/bin/dash -c "nice -n 5 /usr/bin/su root"', "zsh -c sudo"])
def test_denied_programs_behind_wrappers_at_any_position(wide, command) -> None:
    assert "is denied by the daemon's shell policy" in refusal(wide, command), \
        f"BUG: a denied program behind a wrapper runs: {command}"


def test_a_denied_wrapper_itself_is_refused(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["*"])
    ctx.tools_config.shell_deny = ["nice"]
    assert refusal(ctx, "nice echo hi") == "'nice' is denied by the daemon's shell policy", \
        "BUG: a wrapper on the deny list is allowed because only its arguments are checked"


@pytest.mark.parametrize("command", ["env LOG=/usr/bin/sudo echo hi", "env --/usr/bin/sudo echo hi",
                                     "nice -n5 echo hi"])
def test_wrapper_options_and_assignments_are_not_programs(wide, command) -> None:
    assert _check(wide, command) == command.split(), \
        f"BUG: a wrapper's option or VAR=value is mistaken for a denied program: {command}"


def test_non_wrappers_arguments_are_never_programs(wide) -> None:
    assert run(wide, "shell_exec", command="echo sudo") == "exit code 0\nsudo\n"


def test_output_cap_counts_every_byte_across_reads(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["python3"])   # shell_max_output_bytes = 1000
    command = script(ctx, "emit.py", "import sys, time\n"
                     "sys.stdout.write('a' * 999)\nsys.stdout.flush()\ntime.sleep(0.3)\n"
                     "sys.stdout.write('b' * 10)\nsys.stdout.flush()\ntime.sleep(0.3)\n"
                     "sys.stdout.write('c' * 491)\nsys.stdout.flush()\n")
    out = run(ctx, "shell_exec", command=command)
    assert out == "exit code 0\n" + "a" * 999 + "b" + "\n[output truncated at 1000 bytes of 1500]", \
        "BUG: the output cap keeps the wrong bytes or miscounts the total"


def test_output_exactly_at_the_cap_is_not_truncated(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["python3"])
    command = script(ctx, "exact.py", "import sys\nsys.stdout.write('z' * 1000)\n")
    assert run(ctx, "shell_exec", command=command) == "exit code 0\n" + "z" * 1000


def test_undecodable_output_is_replaced(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["python3"])
    command = script(ctx, "latin.py", "import sys\nsys.stdout.buffer.write(b'caf\\xe9')\n")
    assert run(ctx, "shell_exec", command=command) == "exit code 0\ncaf\ufffd"


def test_timeouts_are_capped_by_the_daemon_setting(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["sleep"])
    ctx.tools_config.shell_timeout_secs = 0.5
    assert refusal(ctx, "sleep 30") == "command timed out after 0.5s and was killed"
    with pytest.raises(ToolError) as caught:
        run(ctx, "shell_exec", command="sleep 30", timeout_seconds=60)
    assert str(caught.value) == "command timed out after 0.5s and was killed", \
        "BUG: a model-requested timeout longer than the daemon's limit is honoured"
    with pytest.raises(ToolError) as caught:
        run(ctx, "shell_exec", command="sleep 30", timeout_seconds=0)
    assert str(caught.value) == "timeout_seconds must be greater than 0"


def test_a_killed_program_is_waited_for(tmp_path) -> None:
    import gc
    import time
    import warnings

    ctx = make_ctx(tmp_path, shell=["sleep"])
    ctx.tools_config.shell_timeout_secs = 0.2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert refusal(ctx, "sleep 30") == "command timed out after 0.2s and was killed"
        ctx.cancel.set()
        assert refusal(ctx, "sleep 31") == "command cancelled with the run"
        time.sleep(0.3)   # (the pipe readers end once the programs are dead)
        gc.collect()
    # Popen warns when an object of a child never waited for is collected: the child is a zombie
    # until something polls it.
    running = [str(w.message) for w in caught if "is still running" in str(w.message)]
    assert running == [], f"BUG: a killed command was not waited for: {running}"


def test_missing_and_unrunnable_programs(wide) -> None:
    assert refusal(wide, "no-such-program-xyz") == "program not found: no-such-program-xyz"
    run(wide, "file_write", path="plain.txt", content="not executable")
    assert refusal(wide, "./plain.txt") == "permission denied running ./plain.txt"


def test_cancel_stops_the_program(tmp_path) -> None:
    ctx = make_ctx(tmp_path, shell=["sleep"])
    ctx.cancel.set()
    assert refusal(ctx, "sleep 30") == "command cancelled with the run"


def test_a_shell_running_an_allowed_command_still_runs(wide) -> None:
    assert _check(wide, 'sh -c "echo hi there"') == ["sh", "-c", "echo hi there"]
    assert _check(wide, "bash -c 'LANG=C ls -l'") == ["bash", "-c", "LANG=C ls -l"]


def test_the_program_gets_only_the_harmless_environment(wide, monkeypatch) -> None:
    """The daemon's environment holds provider keys and tokens: a program sees PATH, HOME, the
    locale and the like, and nothing else."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("lc_lower", "not a locale variable")
    monkeypatch.setenv("XLC_ALL", "not one either")
    monkeypatch.setenv("TZ", "UTC")
    out = run(wide, "shell_exec", command="env")
    assert out.startswith("exit code 0\n")
    seen = dict(line.split("=", 1) for line in out.splitlines()[1:])
    kept = {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR"}
    # Plus the marker that finds what the command starts: this daemon, the agent, the command.
    marker = seen.pop("AGENTD_PROCESS", "")
    assert re.fullmatch(rf"{os.getpid()}:agent-1:shell-[0-9a-f]{{12}}", marker), marker
    assert seen == {k: v for k, v in os.environ.items() if k in kept or k.startswith("LC_")}
    assert seen["LC_ALL"] == "C.UTF-8" and seen["LC_TIME"] == "C" and seen["TZ"] == "UTC"
    assert seen["PATH"] == os.environ["PATH"]
    assert not {"OPENAI_API_KEY", "lc_lower", "XLC_ALL"} & set(seen)


def test_the_output_reader_never_holds_the_daemons_exit(tmp_path) -> None:
    """The pipe reader runs while the program does; a program's detached child can hold the pipe
    open for good, so the reader is a daemon thread (named for thread dumps)."""
    ctx = make_ctx(tmp_path, shell=["python3"])
    command = script(ctx, "slow.py", "import time\ntime.sleep(0.8)\nprint('done')\n")
    before = set(threading.enumerate())
    answer: list[str] = []
    caller = threading.Thread(target=lambda: answer.append(run(ctx, "shell_exec", command=command)))
    caller.start()
    deadline = time.monotonic() + 5
    readers: list[threading.Thread] = []
    while not readers and time.monotonic() < deadline:
        readers = [t for t in threading.enumerate() if t not in before and t is not caller]
        time.sleep(0.01)
    caller.join(10)
    assert answer == ["exit code 0\ndone\n"]
    assert [(t.name, t.daemon) for t in readers] == [("shell-drain", True)]


def test_the_marker_is_found_wherever_it_is_in_a_programs_environment_and_only_whole() -> None:
    """A descendant may rebuild its environment (`env -i AGENTD_PROCESS=... prog`): its marker
    can be the first variable, the last or the only one. A program or agent whose id merely
    begins the same is another one, and lives on."""
    def started(marker: str, where: str) -> subprocess.Popen:
        value, path = f"{os.getpid()}:{marker}", os.environ["PATH"]
        env = {"first": {MARKER: value, "PATH": path}, "last": {"PATH": path, MARKER: value}, "only": {MARKER: value}}
        return subprocess.Popen(["/bin/sleep", "60"], env=env[where])

    places = ("first", "last", "only")
    procs = {(marker, where): started(marker, where)
             for marker in ("agent-m:prog-1", "agent-m:prog-10", "agent-mn:prog-1", "agent-k:prog-1")
             for where in places}

    def living() -> set[tuple[str, str]]:
        time.sleep(0.3)  # a SIGKILL sent to any other has landed by now
        return {key for key, p in procs.items() if alive(p.pid)}

    try:
        kill_marked("agent-m", "prog-1")
        assert all(ended(procs["agent-m:prog-1", where].pid) for where in places)
        assert living() == set(procs) - {("agent-m:prog-1", where) for where in places}
        kill_marked("agent-m")  # an agent's release: every program of that agent
        assert all(ended(procs["agent-m:prog-10", where].pid) for where in places)
        assert living() == {(marker, where) for marker in ("agent-mn:prog-1", "agent-k:prog-1") for where in places}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


# Starts `sleep <argv[1]>` in a session of its own (out of the command's process group),
# writes its pid to runaway.pid and prints it, then sleeps <argv[2]> seconds.
ESCAPE = ("import subprocess, sys, time\n"
          "p = subprocess.Popen(['setsid', 'sleep', sys.argv[1]])\n"
          "open('runaway.pid', 'w').write(str(p.pid))\n"
          "print(p.pid, flush=True)\n"
          "time.sleep(float(sys.argv[2]))\n")


@pytest.fixture(scope="module")
def sd(tmp_path_factory, fake_llm):
    daemon = Daemon(make_home(tmp_path_factory.mktemp("shell"), llm_config(fake_llm, NO_REMEMBERING)), env_extra=LLM_ENV).start()
    yield daemon
    stop_shared(daemon)


def ended(pid: int, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_what_a_command_started_in_a_session_of_its_own_ends_with_it(sd) -> None:
    agent = spawn(sd)
    call(sd, agent, "file_write", path="escape.py", content=ESCAPE)
    out = call(sd, agent, "shell_exec", command="python3 escape.py 300 0")
    pid = int(out.removeprefix("exit code 0\n"))
    assert ended(pid), "BUG: a program a shell_exec command started with setsid outlived the command"

    out = call(sd, agent, "shell_exec", command="python3 escape.py 301 30", timeout_seconds=1)
    assert out == "error: command timed out after 1s and was killed"
    pid = int(call(sd, agent, "shell_exec", command="cat runaway.pid").removeprefix("exit code 0\n"))
    assert ended(pid), "BUG: a program a timed-out shell_exec command started with setsid outlived it"
