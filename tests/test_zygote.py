"""The test daemons' zygote (tests/zygote.py): a child it forks starts as `python -m MODULE`
would, answers as a daemon, and reports its end as `subprocess.Popen` does.

Run by the zygote as `python -m test_zygote WHAT` (cwd tests/), this module is the probe:
it reports the state it started in.
"""

import os
import sys

# Before anything else is imported: what the zygote gave the child.
AT_START = {"modules": sorted(sys.modules), "fds": sorted(os.listdir("/proc/self/fd"))}

import atexit  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import support  # noqa: E402
import zygote  # noqa: E402
from support import Daemon, agentd_env, make_home, run_cli, start_process, wait_until  # noqa: E402

# Without pidfds (Linux before 5.3) every daemon is a process of its own and there is no zygote.
pytestmark = pytest.mark.skipif(not zygote.PIDFDS, reason="this kernel gives no pidfds")

TESTS = Path(__file__).resolve().parent


def signal_handlers() -> dict[str, str]:
    return {name: repr(signal.getsignal(getattr(signal, name)))
            for name in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGXFSZ", "SIGCHLD", "SIGHUP", "SIGUSR1")}


def probe(what: str) -> None:
    if what == "sleep":
        time.sleep(120)
    if what.startswith("exit"):
        raise SystemExit(int(what[4:]))
    from agentd.ids import random_uuid_str

    atexit.register(print, "atexit ran", flush=True)
    print(json.dumps({
        **AT_START, "pid": os.getpid(), "environ": dict(os.environ), "cwd": os.getcwd(),
        "path0": sys.path[0], "argv": sys.argv, "name": __name__,
        "streams": [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)],
        "signals": signal_handlers(),
        "random": random.random(), "id": random_uuid_str(), "frozen": gc.get_freeze_count(),
    }), flush=True)
    print("on stderr", file=sys.stderr, flush=True)


def spawn_probe(tmp_path: Path, what: str) -> tuple[zygote.ForkedProcess, Path]:
    env = agentd_env(tmp_path)
    log = tmp_path / f"probe-{what}-{time.monotonic_ns()}.log"
    return zygote.shared(env).spawn([what], env, log, cwd=str(TESTS), module="test_zygote"), log


def probe_report(tmp_path: Path) -> dict:
    proc, log = spawn_probe(tmp_path, "report")
    assert proc.wait(30) == 0, log.read_text()
    return json.loads(log.read_text().splitlines()[0])


def parent_of(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[1])


def test_a_forked_daemon_answers_and_ends_as_a_popen_child_would(tmp_path: Path) -> None:
    d = Daemon(make_home(tmp_path)).start()
    assert isinstance(d.proc, zygote.ForkedProcess)
    assert d.get("/api/status").status_code == 200
    assert d.daemon_file()["pid"] == d.proc.pid
    assert parent_of(d.proc.pid) == zygote.shared(agentd_env(tmp_path)).process.pid
    assert d.proc.poll() is None and d.proc.returncode is None
    with pytest.raises(subprocess.TimeoutExpired):
        d.proc.wait(0.2)
    d.proc.terminate()
    assert d.proc.wait(30) == 0
    assert d.proc.poll() == 0 and d.proc.returncode == 0
    d.proc.kill()   # an ended process: nothing to signal, no error


def test_exit_codes_and_signal_deaths_are_reported_as_popen_reports_them(tmp_path: Path) -> None:
    exits, _ = spawn_probe(tmp_path, "exit3")
    sleeper, _ = spawn_probe(tmp_path, "sleep")
    stopped, _ = spawn_probe(tmp_path, "sleep")
    assert exits.wait(30) == 3
    assert sleeper.poll() is None
    sleeper.kill()
    assert sleeper.wait(10) == -signal.SIGKILL
    os.kill(stopped.pid, signal.SIGSTOP)   # stopped is not ended
    with pytest.raises(subprocess.TimeoutExpired):
        stopped.wait(0.3)
    stopped.send_signal(signal.SIGTERM)
    os.kill(stopped.pid, signal.SIGCONT)
    assert stopped.wait(10) == -signal.SIGTERM


def test_waits_from_several_threads_all_see_the_one_exit(tmp_path: Path) -> None:
    import threading

    proc, _ = spawn_probe(tmp_path, "sleep")
    seen: list[int | None] = []
    waiters = [threading.Thread(target=lambda: seen.append(proc.wait(20))) for _ in range(4)]
    for waiter in waiters:
        waiter.start()
    pollers = [threading.Thread(target=lambda: [proc.poll() for _ in range(200)]) for _ in range(2)]
    for poller in pollers:
        poller.start()
    time.sleep(0.2)
    proc.terminate()
    for thread in waiters + pollers:
        thread.join(30)
    assert seen == [-signal.SIGTERM] * 4 and proc.poll() == -signal.SIGTERM


def test_a_child_starts_as_python_m_would_with_the_requested_environment_and_cwd(tmp_path: Path) -> None:
    requested = {k: v for k, v in agentd_env(tmp_path).items() if k != "PATH"}
    requested["ZYGOTE_PROBE"] = "a value the zygote never had"
    log = tmp_path / "probe.log"
    proc = zygote.shared(requested).spawn(["report"], dict(requested), log, cwd=str(TESTS), module="test_zygote")
    assert proc.wait(30) == 0, log.read_text()
    report, *rest = log.read_text().splitlines()
    report = json.loads(report)
    assert report["pid"] == proc.pid
    assert report["environ"] == requested
    assert report["cwd"] == report["path0"] == str(TESTS)
    assert report["argv"] == [str(TESTS / "test_zygote.py"), "report"] and report["name"] == "__main__"
    assert report["streams"] == ["/dev/null", str(log), str(log)]
    assert rest == ["on stderr", "atexit ran"], "stderr goes to the log; atexit handlers run at the exit"
    assert report["fds"] == ["0", "1", "2", "3"], "only the standard streams (3: the listing itself)"
    assert report["frozen"] > 10000, "what the zygote imported is out of the collector's sight"
    show = "import json, test_zygote; print(json.dumps(test_zygote.signal_handlers()))"
    fresh = subprocess.run([sys.executable, "-c", show], cwd=TESTS, capture_output=True, text=True, check=True).stdout
    assert report["signals"] == json.loads(fresh), "a fresh interpreter's"


def test_a_child_given_an_error_log_writes_its_standard_error_there(tmp_path: Path) -> None:
    env = agentd_env(tmp_path)
    out, err = tmp_path / "out", tmp_path / "err"
    proc = zygote.shared(env).spawn(["report"], env, out, cwd=str(TESTS), module="test_zygote", errors=err)
    assert proc.wait(30) == 0, err.read_text()
    report, *rest = out.read_text().splitlines()
    assert json.loads(report)["streams"] == ["/dev/null", str(out), str(err)]
    assert rest == ["atexit ran"] and err.read_text() == "on stderr\n"


def test_a_cli_command_run_to_completion_is_forked_and_answers_as_a_process_would(
        tmp_path: Path, monkeypatch) -> None:
    home = make_home(tmp_path / "home")

    def no_process_of_its_own(*args, **kwargs):
        raise AssertionError("run as a process of its own")

    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "run", no_process_of_its_own)
        forked = run_cli(home, "status")
    monkeypatch.setenv("AGENTD_TEST_FORK", "0")
    alone = run_cli(home, "status")
    monkeypatch.delenv("AGENTD_TEST_FORK")
    assert (forked.returncode, forked.stdout, forked.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert (forked.returncode, forked.stdout) == (1, "")
    assert forked.stderr.startswith("error: agentd is not running")
    assert forked.args == [sys.executable, "-m", "agentd", "status"]
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(home, "start", port=support.free_port(), timeout=1)
    assert time.monotonic() - started < 10, "a command past its timeout is killed"


def test_the_zygote_has_imported_what_an_idle_daemon_has_and_nothing_else(tmp_path: Path) -> None:
    from test_idle_imports import LAZY

    report = probe_report(tmp_path)
    modules = set(report["modules"])
    assert {"agentd.kernel", "agentd.api.routes_agents", "flask", "pony.orm"} <= modules
    top = {name.split(".")[0] for name in modules}
    assert not LAZY & (top | modules), sorted(LAZY & (top | modules))
    # agentd.daemon reads AGENTD_SWITCH_INTERVAL when imported: the daemon's own value counts.
    assert "agentd.daemon" not in modules
    # PostgreSQL's driver only where the daemons use PostgreSQL (--db=postgres).
    assert ("psycopg2" in modules) == zygote.uses_postgres(agentd_env(tmp_path))


def test_two_children_draw_different_random_numbers_and_ids(tmp_path: Path) -> None:
    first, second = probe_report(tmp_path), probe_report(tmp_path)
    assert first["random"] != second["random"] and first["id"] != second["id"]


def test_another_start_environment_or_directory_gets_a_process_of_its_own(tmp_path: Path, monkeypatch) -> None:
    env, log = agentd_env(tmp_path), tmp_path / "log"
    started = [start_process(["status"], env, log),
               start_process(["status"], {**env, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}, log)]
    with monkeypatch.context() as patch:
        patch.chdir(tmp_path)   # first on the path of `python -m agentd`: it might hold another agentd
        started.append(start_process(["status"], env, log))
    with monkeypatch.context() as patch:
        patch.setattr(support, "FORK_DAEMONS", False)   # outside the test session: the benchmarks
        started.append(start_process(["status"], env, log))
    monkeypatch.setenv("AGENTD_TEST_FORK", "0")
    started.append(start_process(["status"], env, log))
    assert [type(proc) for proc in started] == [zygote.ForkedProcess] + [subprocess.Popen] * 4
    assert [proc.wait(30) for proc in started] == [1] * 5, log.read_text()   # "agentd is not running"


def test_daemons_on_the_other_database_fork_from_a_zygote_of_their_own(tmp_path: Path) -> None:
    env, log = agentd_env(tmp_path), tmp_path / "log"
    other = {**env, "AGENTD_DATABASE_URL": "" if zygote.uses_postgres(env) else "postgresql://nobody@127.0.0.1:1/none"}
    mine, theirs = start_process(["status"], env, log), start_process(["status"], other, log)
    assert type(mine) is type(theirs) is zygote.ForkedProcess
    assert (mine.zygote.postgres, theirs.zygote.postgres) == (zygote.uses_postgres(env), zygote.uses_postgres(other))
    assert parent_of(theirs.pid) == theirs.zygote.process.pid != mine.zygote.process.pid
    again = start_process(["status"], other, log)
    assert again.zygote is theirs.zygote, "started once, then reused"
    assert [mine.wait(30), theirs.wait(30), again.wait(30)] == [1, 1, 1], log.read_text()


def test_the_zygote_ends_when_its_worker_goes_away_and_its_children_live_on(tmp_path: Path) -> None:
    own = zygote.Zygote(agentd_env(tmp_path))
    child = own.spawn(["sleep"], agentd_env(tmp_path), tmp_path / "log", cwd=str(TESTS), module="test_zygote")
    own.channel.close()   # as the kernel closes it when the worker dies
    assert own.process.wait(30) == 0
    try:
        assert Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] in "RS", "the child lives on"
    finally:
        os.kill(child.pid, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{child.pid}").exists()
               or Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] == "Z", "the child's end")


if __name__ == "__main__":
    probe(sys.argv[1])
