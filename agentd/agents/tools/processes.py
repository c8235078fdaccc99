"""process_start/poll/write/kill/list: long-running programs in the agent workspace.

The shell policy applies (agentd/agents/tools/shell.py: deny list, allowlist, no shell, a
scrubbed environment). Each program runs in its own session (process group) so that killing
it ends its children too; the daemon kills every group when the agent is killed or the
daemon stops, and after `[tools] process_max_runtime_secs`. A descendant that left the group
(`setsid`, a daemonizing server) still carries its marker (shell.MARKER) in its environment,
and is found by it.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.agents.tools.files import workspace_root
from agentd.agents.tools.shell import check_argv, check_command, kill_marked, marked_env
from agentd.config import ToolsConfig

KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a process group
KEEP_EXITED = 20
WRITE_WAIT = 5.0  # seconds process_write waits for a program to read its input


class Ring:
    """Output not read yet, at most `limit` bytes: the oldest bytes go first, and are counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.dropped = 0
        self.lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        with self.lock:
            self.data += chunk
            over = len(self.data) - self.limit
            if over > 0:
                del self.data[:over]
                self.dropped += over

    def take(self) -> tuple[str, int]:
        with self.lock:
            text, dropped = bytes(self.data).decode(errors="replace"), self.dropped
            self.data.clear()
            self.dropped = 0
            return text, dropped


@dataclass
class Proc:
    id: str
    agent_id: str
    argv: list[str]
    popen: subprocess.Popen
    out: Ring
    started: float = field(default_factory=time.monotonic)
    # When the program was first seen exited: its uptime stops there.
    ended: float | None = None
    killed_reason: str = ""

    def alive(self) -> bool:
        if self.popen.poll() is None:
            return True
        if self.ended is None:
            self.ended = time.monotonic()
        return False

    def summary(self) -> dict[str, Any]:
        alive = self.alive()
        return {"process_id": self.id, "command": " ".join(self.argv), "pid": self.popen.pid,
                "alive": alive, "exit_code": self.popen.returncode,
                "uptime_secs": round((time.monotonic() if alive else self.ended) - self.started, 1)}


def _limits(memory_bytes: int):
    """Runs in the child between fork and exec: only the one system call."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    return apply


def kill_group(popen: subprocess.Popen, grace: float = KILL_GRACE) -> None:
    """SIGTERM the process group, SIGKILL it after `grace`, and reap the leader."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            popen.wait(wait)
            # The leader is gone; a child that ignored SIGTERM may remain in the group.
            if sig == signal.SIGTERM:
                try:
                    os.killpg(popen.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        except subprocess.TimeoutExpired:
            continue


class ProcessTable:
    """Every agent's running programs; thread-safe."""

    def __init__(self, config: ToolsConfig) -> None:
        self.config = config
        self._procs: dict[str, Proc] = {}
        self._lock = threading.Lock()
        self._closed = False

    def start(self, ctx: ToolContext, argv: list[str]) -> Proc:
        cfg = self.config
        with self._lock:
            if self._closed:
                raise ToolError("the daemon is stopping")
            mine = [p for p in self._procs.values() if p.agent_id == ctx.agent_id]
            # Exited programs stay listed (their last output and exit code) until killed,
            # the oldest forgotten beyond KEEP_EXITED.
            exited = [p for p in mine if not p.alive()]
            for proc in exited[:max(0, len(exited) - KEEP_EXITED)]:
                del self._procs[proc.id]
            running = [p for p in mine if p.alive()]
            if len(running) >= cfg.process_max_per_agent:
                raise ToolError(f"this agent already runs {len(running)} processes (the limit is "
                                f"{cfg.process_max_per_agent}): kill one with process_kill first")
            proc_id = f"proc-{uuid.uuid4().hex[:8]}"
            try:
                popen = subprocess.Popen(argv, cwd=workspace_root(ctx),
                                         env=marked_env(ctx.agent_id, proc_id),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         preexec_fn=_limits(cfg.process_max_memory_mb * 1024 * 1024))
            except FileNotFoundError:
                raise ToolError(f"program not found: {argv[0]}") from None
            except PermissionError:
                raise ToolError(f"permission denied running {argv[0]}") from None
            proc = Proc(proc_id, ctx.agent_id, argv, popen, Ring(cfg.process_buffer_bytes))
            self._procs[proc.id] = proc
        threading.Thread(target=self._read, args=(proc,), daemon=True, name=f"proc-{proc.id}").start()
        return proc

    def _read(self, proc: Proc) -> None:
        """Fill the ring while the program runs; end it when its run time is up."""
        stdout = proc.popen.stdout
        assert stdout is not None
        deadline = proc.started + self.config.process_max_runtime_secs
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._expire, args=(proc,))
        timer.daemon = True
        timer.start()
        try:
            with stdout:
                while chunk := stdout.read1(65536):
                    proc.out.add(chunk)
        except (OSError, ValueError):
            pass
        finally:
            timer.cancel()
            proc.popen.wait()
            proc.alive()

    def _expire(self, proc: Proc) -> None:
        if proc.alive():
            proc.killed_reason = f"killed after {self.config.process_max_runtime_secs:g}s (the run time limit)"
            kill_group(proc.popen)
            kill_marked(proc.agent_id, proc.id)

    def get(self, agent_id: str, process_id: str) -> Proc:
        with self._lock:
            proc = self._procs.get(process_id)
        if proc is None or proc.agent_id != agent_id:
            raise ToolError(f"no process {process_id!r} for this agent (see process_list)")
        return proc

    def list(self, agent_id: str) -> list[Proc]:
        with self._lock:
            return [p for p in self._procs.values() if p.agent_id == agent_id]

    def kill(self, proc: Proc) -> None:
        with self._lock:
            self._procs.pop(proc.id, None)
        kill_group(proc.popen)
        kill_marked(proc.agent_id, proc.id)
        if proc.popen.stdin is not None:
            try:
                proc.popen.stdin.close()
            except OSError:
                pass

    def release(self, agent_id: str) -> None:
        """Kill every program of an agent (it was killed)."""
        for proc in self.list(agent_id):
            self.kill(proc)
        kill_marked(agent_id)  # (those of programs no longer listed too)

    def close(self) -> None:
        """Kill every program (the daemon stops); the groups are signalled together."""
        with self._lock:
            self._closed = True
            procs = list(self._procs.values())
        threads = [threading.Thread(target=self.kill, args=(p,), daemon=True) for p in procs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(KILL_GRACE + 6)
        kill_marked()


def _table(ctx: ToolContext) -> ProcessTable:
    return ctx.require_services().processes


_ID = {"process_id": {"type": "string", "description": "The process ID returned by process_start"}}


@tool("process_start", "Start a long-running process (REPL, server, watcher). Returns a process_id for "
      "subsequent poll/write/kill operations. An agent may run only a few at once; exited ones do not count.",
      {"command": {"type": "string", "description": "The executable to run (e.g. 'python', 'node', 'npm')"},
       "args": {"type": "array", "items": {"type": "string"},
                "description": "Command-line arguments (e.g. ['-i'] for interactive Python)"}},
      ("command",), capability="shell", family="processes")
def process_start(ctx: ToolContext, args: dict[str, Any]) -> str:
    extra = args.get("args")
    if not extra and any(c.isspace() for c in args["command"].strip()):
        # "python3 -m http.server" in `command` (and no `args`): split it as shell_exec does (no shell).
        argv = check_command(ctx, args["command"])
    else:
        if not all(isinstance(a, str) for a in extra or []):
            raise ToolError("args must be an array of strings")
        argv = check_argv(ctx, [args["command"], *(extra or [])])
    proc = _table(ctx).start(ctx, argv)
    ctx.audit("tool.process_start", {"process_id": proc.id, "command": argv[0], "pid": proc.popen.pid})
    return json.dumps({"process_id": proc.id, "pid": proc.popen.pid, "command": " ".join(argv)})


@tool("process_poll", "Read accumulated stdout/stderr from a running process. Non-blocking: returns whatever "
      "output has buffered since the last poll.", _ID, ("process_id",), read_only=True, capability="shell",
      family="processes")
def process_poll(ctx: ToolContext, args: dict[str, Any]) -> str:
    proc = _table(ctx).get(ctx.agent_id, args["process_id"])
    alive = proc.alive()
    output, dropped = proc.out.take()
    result: dict[str, Any] = {"process_id": proc.id, "alive": alive,
                              "exit_code": None if alive else proc.popen.returncode, "output": output}
    if dropped:
        result["dropped_bytes"] = dropped
    if proc.killed_reason:
        result["note"] = proc.killed_reason
    return json.dumps(result, ensure_ascii=False)


@tool("process_write", "Write data to a running process's stdin. A newline is appended automatically if not "
      "present.", {**_ID, "data": {"type": "string", "description": "The data to write to stdin"}},
      ("process_id", "data"), capability="shell", family="processes")
def process_write(ctx: ToolContext, args: dict[str, Any]) -> str:
    proc = _table(ctx).get(ctx.agent_id, args["process_id"])
    data = args["data"] if args["data"].endswith("\n") else args["data"] + "\n"
    if not proc.alive() or proc.popen.stdin is None:
        raise ToolError(f"process {proc.id} has exited (code {proc.popen.returncode})")
    payload = data.encode()
    try:
        sent = _write_within(proc.popen.stdin.fileno(), payload, WRITE_WAIT)
    except (BrokenPipeError, OSError, ValueError):
        raise ToolError(f"process {proc.id} no longer reads its input") from None
    if sent:
        ctx.audit("tool.process_write", {"process_id": proc.id, "bytes": sent})
    if sent < len(payload):
        raise ToolError(f"process {proc.id} took {sent} of {len(payload)} bytes within {WRITE_WAIT:g}s: "
                        "it is not reading its input")
    return f"wrote {len(payload)} bytes to {proc.id}"


def _write_within(fd: int, payload: bytes, wait: float) -> int:
    """Write what the program reads within `wait` seconds; the number of bytes written.

    A program that does not read its input would otherwise hold the call (and a tool
    thread) until the tool's deadline once the pipe is full.
    """
    os.set_blocking(fd, False)
    sent = 0
    deadline = time.monotonic() + wait
    while sent < len(payload):
        if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            break
        try:
            sent += os.write(fd, payload[sent:])
        except BlockingIOError:
            continue
    return sent


@tool("process_kill", "Terminate a running process and clean up its resources.", _ID, ("process_id",),
      capability="shell", family="processes")
def process_kill(ctx: ToolContext, args: dict[str, Any]) -> str:
    table = _table(ctx)
    proc = table.get(ctx.agent_id, args["process_id"])
    table.kill(proc)
    ctx.audit("tool.process_kill", {"process_id": proc.id, "pid": proc.popen.pid})
    return f"process {proc.id} killed (exit code {proc.popen.returncode})"


@tool("process_list", "List all running processes for the current agent, including their IDs, commands, uptime, "
      "and alive status.", {}, read_only=True, capability="shell", family="processes")
def process_list(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps([p.summary() for p in _table(ctx).list(ctx.agent_id)], ensure_ascii=False)
