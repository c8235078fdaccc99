"""Check that an installed agentd works with what was installed: every module imports, and a
daemon starts, spawns an agent and stores a semantic memory (the bundled model loads).

.ci/run runs it in a fresh virtual environment made from requirements.txt alone
(`pip install -r requirements.txt && pip install --no-deps -e .`), so a runtime dependency
missing from requirements.txt fails CI. Exit status 0 when everything works.
"""

from __future__ import annotations

import os
import pkgutil
import importlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests


# Packages of the optional extras (setup.cfg): a module built on one of them imports only
# where that extra is installed.
EXTRAS = {"mcp", "a2wsgi", "opentelemetry", "selenium", "docker"}


def import_everything() -> int:
    import agentd

    count = 0
    for module in pkgutil.walk_packages(agentd.__path__, "agentd."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in EXTRAS:
                raise
            continue
        count += 1
    return count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_daemon() -> None:
    with tempfile.TemporaryDirectory(prefix="agentd-install-") as home:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTD_")}
        env.update(AGENTD_HOME=home, AGENTD_LISTEN=f"127.0.0.1:{port}")
        log = open(Path(home) / "daemon.log", "wb")
        daemon = subprocess.Popen([sys.executable, "-m", "agentd", "start"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                if daemon.poll() is not None:
                    raise SystemExit(f"the daemon exited with {daemon.returncode}:\n"
                                     + (Path(home) / "daemon.log").read_text(errors="replace"))
                try:
                    if requests.get(f"{base}/api/status", timeout=5).ok:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon did not answer within 60 s")
                time.sleep(0.2)
            spawned = requests.post(f"{base}/api/agents", timeout=30, json={
                "manifest_toml": 'name = "install-check"\nprofile = "minimal"\n'})
            assert spawned.status_code == 201, spawned.text
            agent = spawned.json()["agent_id"]
            stored = requests.post(f"{base}/api/memory/agents/{agent}/memories", timeout=120,
                                   json={"content": "the install check ran"})
            assert stored.status_code == 201, stored.text
        finally:
            daemon.send_signal(signal.SIGTERM)
            code = daemon.wait(30)
            log.close()
        if code != 0:
            raise SystemExit(f"the daemon stopped with exit status {code}")


def main() -> None:
    count = import_everything()
    run_daemon()
    print(f"agentd works from this install: {count} modules import; the daemon starts, spawns "
          "an agent and stores a memory")


if __name__ == "__main__":
    main()
