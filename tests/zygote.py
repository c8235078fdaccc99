"""A zygote for the test daemons: one process per pytest worker (and a second for daemons on
PostgreSQL) that has imported what `python -m agentd start` imports and forks a child that
becomes the daemon, so that each daemon the suite starts skips those imports (most of a
daemon's CPU before it answers).

Run as a script, this file is the zygote: it serves requests on a SOCK_SEQPACKET socket
(one JSON message a request, one a reply) until the worker closes it or goes away. Imported,
it is the worker's side: `shared(env)` starts the zygote on first use and `Zygote.spawn`
returns a `ForkedProcess`, which answers as much of `subprocess.Popen` as the tests use.

The zygote never reaps a child unless asked: a child that has exited stays a zombie, its pid
taken, until the worker (which sees the exit on a pidfd) asks for its status. So a pid the
worker signals is the daemon's or a zombie's, never a stranger's, as with a child of its own.

What a child cannot have afresh: the hash seed of `str` (the zygote's, so a worker's daemons
order their sets alike) and what the interpreter read from the environment at its start
(`STARTUP_VARIABLES`: a daemon that sets those gets a process of its own). And what the zygote
imported starts frozen (`gc.freeze`), where a daemon's boot puts it anyway.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# What the daemon imports by the time it answers: the CLI, what agentd.daemon imports, and
# what its boot imports (the kernel, the app and its routes). Not agentd.daemon itself: it
# reads AGENTD_SWITCH_INTERVAL when imported, and must read the daemon's own environment.
# Nothing here may start a thread or load what a daemon loads on first use only
# (tests/test_idle_imports.py's LAZY; agentd.api.openapi is apispec's, the API docs').
PRELOAD = ("agentd.cli", "agentd.cli.workflow", "agentd.cli.cron", "agentd.cli.client", "agentd.tracing",
           "agentd.config", "agentd.logs", "agentd.malloc_tuning", "agentd.server.serve",
           "agentd.server.startgate", "agentd.store", "agentd.cluster.config", "agentd.kernel",
           "agentd.providers", "agentd.api")
PRELOAD_PACKAGES = ("agentd.api",)
NOT_PRELOADED = ("agentd.api.openapi",)
# What a daemon on PostgreSQL imports besides: the zygote of daemons whose environment names
# a database (the --db=postgres pass) has it; a SQLite daemon never loads it.
PRELOAD_POSTGRES = ("pony.orm.dbproviders.postgres",)

# Environment variables the interpreter or the C library read when the process starts: a
# forked child keeps the zygote's, so a daemon that asks for other values needs a process
# of its own (e.g. a PYTHONPATH with a sitecustomize on it).
STARTUP_VARIABLES = ("PYTHON", "MALLOC_", "LD_", "GLIBC_TUNABLES", "LANG", "LC_", "TZ")
MESSAGE_MAX = 1 << 20


def startup_part(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_VARIABLES)}


def uses_postgres(env: dict[str, str]) -> bool:
    return env.get("AGENTD_DATABASE_URL", "").startswith("postgres")


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


# -- the zygote ------------------------------------------------------------------------------
def preload(postgres: bool) -> None:
    import importlib
    import pkgutil

    for name in PRELOAD + (PRELOAD_POSTGRES if postgres else ()):
        importlib.import_module(name)
    for package in PRELOAD_PACKAGES:
        for found in pkgutil.walk_packages(sys.modules[package].__path__, package + "."):
            if found.name not in NOT_PRELOADED:
                importlib.import_module(found.name)


def serve(channel: socket.socket) -> dict[str, Any]:
    """Answer requests until the worker goes away (then exit). Returns only in a forked
    child: the request it is to carry out."""
    while True:
        data = channel.recv(MESSAGE_MAX)
        if not data:
            raise SystemExit(0)
        request = json.loads(data)
        if request["op"] == "fork":
            # A thread would not survive the fork, and whatever lock it held would stay held.
            if threads() != 1:
                reply: dict[str, Any] = {"error": f"the zygote runs {threads()} threads: it cannot fork"}
            else:
                try:
                    pid = os.fork()
                except OSError as exc:
                    reply = {"error": f"fork: {exc}"}
                else:
                    if pid == 0:
                        channel.close()
                        return request
                    reply = {"pid": pid}
        elif request["op"] == "wait":
            _, status = os.waitpid(request["pid"], 0)
            reply = {"returncode": os.waitstatus_to_exitcode(status)}
        else:
            reply = {"error": f"unknown request {request['op']!r}"}
        channel.send(json.dumps(reply).encode())


def become(request: dict[str, Any], sigint: Any) -> None:
    """In the forked child: become `python -m MODULE ARGS` with the request's environment,
    cwd, log and error log (the log when none; stdin is the zygote's /dev/null), as a process
    of its own would start."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = os.getcwd()   # what `-m` puts first
    for fd, path in ((1, request["log"]), (2, request.get("errors") or request["log"])):
        opened = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.dup2(opened, fd)
        os.close(opened)
    signal.signal(signal.SIGINT, sigint)
    sys.argv = [request["module"], *request["args"]]
    import runpy

    # Its SystemExit or exception ends the child as it would end `python -m MODULE`.
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    # What an interpreter started now would have: Python's handler, or SIG_IGN when the
    # suite itself runs with SIGINT ignored (in the background, under nohup).
    sigint = signal.getsignal(signal.SIGINT)
    # Ctrl-C reaches the whole process group: the worker decides, and its going away ends this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[0] = os.getcwd()   # started as a script; its children run as `python -m agentd`
    preload(postgres=sys.argv[2:] == ["postgres"])
    if threads() != 1:
        raise SystemExit(f"the zygote runs {threads()} threads after its imports")
    # What was imported stays out of the collector's sight in every child, as a daemon's boot
    # puts it anyway (agentd/daemon.py): a child's collections and its exit then leave those
    # pages shared with the zygote instead of copying them to touch each object.
    gc.freeze()
    become(serve(channel), sigint)


# -- the worker's side -----------------------------------------------------------------------
class ForkedProcess:
    """A daemon forked by the zygote, with the part of `subprocess.Popen` the tests use."""

    def __init__(self, zygote: "Zygote", pid: int, args: list[str]) -> None:
        self.zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        # Safe although the zygote is the parent: it reaps only when asked (module docstring).
        self._pidfd: int | None = os.pidfd_open(pid)
        self._waiting = threading.Lock()   # as Popen's: one thread waits, poll() never blocks

    def _reap_if_exited(self, timeout: float | None) -> None:
        if self.returncode is not None or self._pidfd is None:
            return
        waiter = select.poll()
        waiter.register(self._pidfd, select.POLLIN)
        if waiter.poll(None if timeout is None else max(0, int(timeout * 1000))):
            self.returncode = self.zygote.request({"op": "wait", "pid": self.pid})["returncode"]
            os.close(self._pidfd)
            self._pidfd = None

    def poll(self) -> int | None:
        if self.returncode is None and self._waiting.acquire(blocking=False):
            try:
                self._reap_if_exited(0)
            finally:
                self._waiting.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            if not self._waiting.acquire(timeout=-1 if timeout is None else timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
            try:
                self._reap_if_exited(None if deadline is None else deadline - time.monotonic())
            finally:
                self._waiting.release()
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The worker's end of one zygote process."""

    def __init__(self, env: dict[str, str], cwd: str | None = None) -> None:
        self.postgres = uses_postgres(env)
        env = {k: v for k, v in env.items() if not k.startswith("AGENTD_")}
        self.startup = startup_part(env)
        self.cwd = cwd or os.getcwd()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.channel = ours
        command = [sys.executable, str(Path(__file__).resolve()), str(theirs.fileno())]
        self.process = subprocess.Popen(command + ["postgres"] * self.postgres,
                                        env=env, cwd=self.cwd, stdin=subprocess.DEVNULL,   # its children's too
                                        pass_fds=[theirs.fileno()])
        theirs.close()
        self._lock = threading.Lock()

    def can_start(self, env: dict[str, str], cwd: str) -> bool:
        """Whether a child of this zygote starts as a process of its own would in `env` and
        `cwd`: the interpreter reads the one when it starts, and the other comes first on
        `sys.path`, where the zygote's imports were found."""
        return (startup_part(env) == self.startup and os.path.realpath(cwd) == os.path.realpath(self.cwd)
                and uses_postgres(env) == self.postgres)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            try:
                self.channel.send(json.dumps(message).encode())
                data = self.channel.recv(MESSAGE_MAX)
            except OSError:
                data = b""
        if not data:
            raise RuntimeError(f"the test zygote (pid {self.process.pid}) has gone away "
                               f"(exit {self.process.poll()}); its error is in the test output")
        reply = json.loads(data)
        if "error" in reply:
            raise RuntimeError(f"the test zygote: {reply['error']}")
        return reply

    def spawn(self, args: list[str], env: dict[str, str], log: Path, cwd: str | None = None,
              module: str = "agentd", errors: Path | None = None) -> ForkedProcess:
        """`python -m MODULE ARGS` in environment `env`, its output appended to `log` (its
        standard error to `errors` if given)."""
        reply = self.request({"op": "fork", "module": module, "args": args, "env": env,
                              "cwd": cwd or os.getcwd(), "log": str(log), "errors": str(errors or "")})
        return ForkedProcess(self, reply["pid"], [sys.executable, "-m", module, *args])

    def close(self) -> None:
        """End the zygote (its children live on, as daemons the worker left behind always did)."""
        with self._lock:
            self.channel.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# By whether its daemons use PostgreSQL: either pass starts both kinds (the tests of daemons
# sharing a PostgreSQL database run on the SQLite pass too), and only the one imports its driver.
_shared: dict[bool, Zygote] = {}
# The worker's own directory (a test may be in another when it starts the first daemon).
_WORKER_CWD = os.getcwd()
_shared_lock = threading.Lock()


def _pidfds_work() -> bool:
    """Whether this kernel and Python give pidfds (Linux 5.3 and later), which watch a child."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


PIDFDS = _pidfds_work()


def shared(env: dict[str, str]) -> Zygote | None:
    """This process's zygote for daemons like the one `env` starts (started on first use,
    ended at exit), or None when a child of it would not start as a process with environment
    `env` in the current directory would, or cannot be watched here (no pidfds)."""
    if not PIDFDS:
        return None
    postgres = uses_postgres(env)
    with _shared_lock:
        source = _shared.get(postgres)
        if source is None:
            source = _shared[postgres] = Zygote(env, _WORKER_CWD)
            atexit.register(source.close)
    return source if source.can_start(env, os.getcwd()) else None


if __name__ == "__main__":
    main()
