"""The clean-stop check itself: a daemon that logs a traceback or exits
non-zero fails the test that started it, unless the test says it expects a crash."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

INNER = '''
import os, signal, time
import pytest
from support import TRACEBACK

def test_traceback_in_log_fails(daemon_factory):
    d = daemon_factory()
    with open(d.log_path, "a") as f:   # what a crashing request handler leaves behind
        f.write(TRACEBACK + "\\n  File \\"x.py\\", line 1\\nZeroDivisionError: boom\\n")

def test_nonzero_exit_fails(daemon_factory):
    d = daemon_factory()
    os.kill(d.proc.pid, signal.SIGKILL)   # behind the helper's back: an unexplained death
    d.proc.wait(10)

def test_clean_daemon_passes(daemon_factory):
    assert daemon_factory().get("/api/health").ok

def test_expected_crash_opts_out(daemon_factory):
    d = daemon_factory().expect_crash("this test kills it")
    os.kill(d.proc.pid, signal.SIGKILL)
    d.proc.wait(10)

@pytest.mark.daemon_may_crash("marker form")
def test_marker_opts_out(daemon_factory):
    d = daemon_factory()
    with open(d.log_path, "a") as f:
        f.write(TRACEBACK + "\\n")
'''


@pytest.mark.slow
def test_clean_stop_check_flags_tracebacks_and_bad_exits(tmp_path: Path) -> None:
    for name in ("conftest.py", "support.py", "pgtest.py", "fakellm.py", "zygote.py"):
        shutil.copy(HERE / name, tmp_path / name)
    (tmp_path / "test_inner.py").write_text(INNER)
    root = HERE.parent
    # The same plugins left out as setup.cfg's addopts leaves out (this run does not read it).
    plugins = [arg for name in ("cacheprovider", "randomly", "langsmith_plugin", "hypothesispytest",
                                "schemathesis", "benchmark") for arg in ("-p", f"no:{name}")]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", *plugins,
                          "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                         cwd=root, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert "ERROR at teardown of test_traceback_in_log_fails" in text, text
    assert "logged a Python traceback" in text and "ZeroDivisionError: boom" in text, text
    assert "ERROR at teardown of test_nonzero_exit_fails" in text, text
    assert "exited with code -9" in text, text
    assert "5 passed, 2 errors" in text, text
