"""shell_exec: run one program, without a shell, in the agent workspace.

Also what every tool that starts programs shares: the shell policy, the scrubbed
environment, and the marker that finds a program's descendants after they left its process
group (`setsid`, `nohup ... &` in a script, a daemonizing server) to kill them with it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.agents.tools.files import workspace_root

# Without a shell these do nothing useful, and their presence means the model expects
# shell semantics (pipes, redirects, chaining, substitution) we will not provide.
METACHARACTERS = (";", "|", "&", "`", "$(", "${", ">", "<", "\n", "\r")
POLL = 0.05
# Programs that run another program from their arguments: the deny list applies to what they run.
WRAPPERS = {"env", "nice", "nohup", "timeout", "stdbuf", "setsid", "xargs", "time", "ionice", "command",
            "exec", "doas", "chrt", "taskset",
            # Shells run the command line in their `-c` argument: `sh -c "sudo id"`.
            "sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "busybox"}


# `<daemon pid>:<agent id>:<program id>` in the environment of a program and of everything it starts.
MARKER = "AGENTD_PROCESS"
ENV_KEEP = {"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME", "SHELL", "TMPDIR"}


def _wrapped_programs(argv: list[str]) -> list[str]:
    """Basenames of the programs a command would run, looking through wrappers like `env` or `nice`.

    A heuristic (options taking values are not parsed), so a denied name anywhere after a
    wrapper counts: refusing `nice -n 5 sudo id` matters more than allowing `env echo sudo`.
    """
    names = [os.path.basename(argv[0])]
    if names[0] in WRAPPERS:
        # Every word of every argument: a shell's `-c "FOO=1 env sudo id"` is one argument.
        words = [word for arg in argv[1:] for word in arg.split()]
        names += [os.path.basename(w) for w in words if not w.startswith("-") and "=" not in w]
    return names


def check_command(ctx: ToolContext, command: str) -> list[str]:
    """A command line split without a shell (metacharacters refused), then `check_argv`."""
    for meta in METACHARACTERS:
        if meta in command:
            raise ToolError(f"shell metacharacter {meta!r} is not allowed: commands run without a shell "
                            "(one program with its arguments)")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ToolError(f"cannot parse the command: {exc}") from None
    return check_argv(ctx, argv)


_check = check_command  # the name tests use


def check_argv(ctx: ToolContext, argv: list[str]) -> list[str]:
    """The shell policy for one program and its arguments: the daemon's deny list (through
    wrappers) and the agent's `shell` allowlist. Every tool that starts programs asks here."""
    if not argv or not argv[0].strip():
        raise ToolError("empty command")
    if any("\0" in arg for arg in argv):
        raise ToolError("the command contains a NUL character (\\u0000), which no program argument can hold")
    program = os.path.basename(argv[0])
    for name in _wrapped_programs(argv):
        if name in ctx.tools_config.shell_deny:
            raise ToolError(f"'{name}' is denied by the daemon's shell policy")
    allowed = ctx.capabilities.get("shell") or []
    if allowed is True:
        allowed = ["*"]
    if "*" not in allowed and program not in allowed:
        raise ToolError(f"'{program}' is not in this agent's shell allowlist ({', '.join(allowed) or 'empty'})")
    return argv


def scrubbed_env() -> dict[str, str]:
    """The environment a program started by a tool gets: the daemon's own holds provider keys,
    channel tokens and database URLs, so only variables a program needs to run are passed on."""
    return {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith("LC_")}


def marked_env(agent_id: str, program_id: str) -> dict[str, str]:
    """`scrubbed_env()` with MARKER naming this daemon, the agent and the program."""
    return {**scrubbed_env(), MARKER: f"{os.getpid()}:{agent_id}:{program_id}"}


def kill_marked(*path: str) -> None:
    """SIGKILL every process whose MARKER starts with this daemon's pid and `path` (agent id,
    program id), wherever it now is in the process tree."""
    needle = b"\0" + ":".join((f"{MARKER}={os.getpid()}", *path)).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = b"\0" + fh.read()
        except OSError:
            continue
        at = environ.find(needle)
        # Mutation runs leave this test alone: its mutants SIGKILL processes that are not ours.
        if at >= 0 and environ[at + len(needle):at + len(needle) + 1] in (b"\0", b":", b""):  # pragma: no mutate
            try:
                os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _kill(proc: subprocess.Popen, mark: tuple[str, str]) -> None:
    """End the command's whole process group and what left it (`mark`: its agent and program
    ids, as in its marker), and reap the command (no zombie is left)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except PermissionError:
        return
    except ProcessLookupError:
        pass
    kill_marked(*mark)
    proc.wait()


@tool("shell_exec", "Run one program with arguments (no shell: no pipes, redirects or chaining) in the "
      "agent workspace; returns the exit code and combined output.",
      {"command": {"type": "string", "description": "Program and arguments, e.g. 'ls -la'"},
       "timeout_seconds": {"type": "integer", "description": "Seconds before the program is killed"}},
      ("command",), capability="shell")
def shell_exec(ctx: ToolContext, args: dict[str, Any]) -> str:
    argv = check_command(ctx, args["command"])
    cfg = ctx.tools_config
    requested = args.get("timeout_seconds")
    if requested is not None and requested <= 0:
        raise ToolError("timeout_seconds must be greater than 0")
    timeout = min(float(requested or cfg.shell_timeout_secs), cfg.shell_timeout_secs)
    mark = (ctx.agent_id, f"shell-{uuid.uuid4().hex[:12]}")
    try:
        # Own session: a timeout kills the whole process group, grandchildren included; the
        # marker finds those that started a session of their own.
        proc = subprocess.Popen(argv, cwd=workspace_root(ctx), stdin=subprocess.DEVNULL, env=marked_env(*mark),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except FileNotFoundError:
        raise ToolError(f"program not found: {argv[0]}") from None
    except PermissionError:
        raise ToolError(f"permission denied running {argv[0]}") from None
    limit = cfg.shell_max_output_bytes
    drain = _Drain(proc, limit)
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if ctx.cancel is not None and ctx.cancel.is_set():
            _kill(proc, mark)
            raise ToolError("command cancelled with the run")
        if time.monotonic() >= deadline:
            _kill(proc, mark)
            raise ToolError(f"command timed out after {timeout:g}s and was killed")
        time.sleep(POLL)
    # Background children left behind would outlive the call (and may hold the pipe open):
    # the session and the marker are the command's alone, so end whatever is left of it.
    _kill(proc, mark)
    drain.thread.join(5)
    text = drain.text()
    if drain.total > limit:
        text += f"\n[output truncated at {limit} bytes of {drain.total}]"
    return f"exit code {proc.returncode}\n{text}"


class _Drain:
    """Reads the pipe while the program runs (a full pipe would stall it); keeps the first `limit` bytes."""

    def __init__(self, proc: subprocess.Popen, limit: int) -> None:
        self.kept = bytearray()
        self.total = 0
        self.limit = limit
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True, name="shell-drain")
        self.thread.start()

    def text(self) -> str:
        """What was kept so far, decoded (safe while the reader is still running)."""
        with self.lock:
            return bytes(self.kept).decode(errors="replace")  # str.decode is always UTF-8

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            while chunk := proc.stdout.read1(65536):
                with self.lock:
                    self.total += len(chunk)
                    room = self.limit - len(self.kept)
                    if room > 0:
                        self.kept += chunk[:room]
