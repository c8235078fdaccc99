"""Start the daemon under mutation testing: `python tests/mutmut_daemon.py start` (any
agentd command, or `-c SCRIPT` for a test's own script).

support.Daemon and support.run_cli use this launcher (instead of `python -m agentd`) only
when mutmut's MUTANT_UNDER_TEST is set. It does three things plain `python -m agentd` cannot:

* It imports agentd from the working directory, which mutmut sets to its `mutants/` copy,
  so the daemon runs the mutated code (`python -m` would do the same; this keeps it explicit).
* During mutmut's stats phase (MUTANT_UNDER_TEST=stats) it records which mutated functions
  the daemon ran. mutmut records those hits only inside the pytest process, so without this
  every function reached only through the daemon would have "no tests" and its mutants would
  never run. Each hit name is appended once to $AGENTD_MUTMUT_HITS; the test process takes
  the file after each test (support.take_daemon_hits) and hands the names to mutmut.
* It stops the daemon when the test process is gone (mutmut kills timed-out tests outright).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time


def _record_hits(path: str) -> None:
    import mutmut.mutation.trampoline as trampoline

    seen: set[str] = set()
    lock = threading.Lock()

    def record(name: str, caller: str | None = None) -> None:
        with lock:
            # The test process renames the file away when a test ends: start a new set.
            if not os.path.exists(path):
                seen.clear()
            if name in seen:
                return
            seen.add(name)
            with open(path, "a", encoding="utf-8") as f:
                f.write(name + "\n")

    trampoline.record_trampoline_hit = record


def _end_with_the_test(parent: int) -> None:
    """mutmut kills a test that runs past its time limit (SIGKILL: no fixture teardown), so
    the daemons it started would run on for good. Watch the parent (the test process) and
    stop this daemon the usual way (SIGTERM) once it is gone. A thread polling the parent
    pid, not PR_SET_PDEATHSIG: that fires when the *thread* that started us ends, and some
    tests start daemons from short-lived threads."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.getcwd())
    hits = os.environ.get("AGENTD_MUTMUT_HITS")
    if os.environ.get("MUTANT_UNDER_TEST") == "stats" and hits:
        _record_hits(hits)
    threading.Thread(target=_end_with_the_test, args=(os.getppid(),), name="mutmut-parent-watch",
                     daemon=True).start()
    if sys.argv[1:2] == ["-c"]:   # a test's own script, run as `python -c SCRIPT` runs it
        script = sys.argv[2]
        sys.argv = ["-c", *sys.argv[3:]]
        exec(compile(script, "<string>", "exec"), {"__name__": "__main__"})
        return
    sys.argv = ["agentd", *sys.argv[1:]]
    runpy.run_module("agentd", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
