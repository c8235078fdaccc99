"""docker_exec through the real daemon against a fake Docker Engine API on a unix socket."""

from __future__ import annotations

import pytest

from conftest import LLM_ENV, NO_REMEMBERING, llm_config
from fakes.docker_engine import FakeDockerEngine
from support import Daemon, make_home, stop_shared
from tests.agents.tools.tool_calls import SHELL, call, spawn

pytest.importorskip("docker")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    fake = FakeDockerEngine(str(tmp_path_factory.mktemp("engine") / "docker.sock"))
    yield fake
    fake.close()


@pytest.fixture(scope="module")
def cd(tmp_path_factory, fake_llm, engine):
    extra = (f'\n[tools]\ncontainer_runtime = "{engine.path}"\ncontainer_timeout_secs = 1.5\n'
             'container_memory_mb = 256\ncontainer_cpus = 0.5\n')
    home = make_home(tmp_path_factory.mktemp("containers"), llm_config(fake_llm, extra + NO_REMEMBERING))
    daemon = Daemon(home, env_extra=LLM_ENV).start()
    yield daemon
    stop_shared(daemon)


def test_a_command_runs_in_a_limited_container_that_is_removed(cd, engine) -> None:
    agent = spawn(cd, SHELL)
    assert call(cd, agent, "docker_exec", command="echo out && echo err >&2 && exit 3") == \
        "exit code 3\nout\nerr\n"
    create = [r for r in engine.requests if r["path"] == "/containers/create"][-1]["json"]
    assert create["Image"] == "debian:bookworm-slim" and create["Cmd"] == ["sh", "-c",
                                                                          "echo out && echo err >&2 && exit 3"]
    assert create["NetworkDisabled"] is True and create["Labels"] == {"agentd.agent": agent}
    host = create["HostConfig"]
    assert (host["Memory"], host["NanoCpus"], host["NetworkMode"], host["CapDrop"]) == \
        (256 * 1024 * 1024, 500_000_000, "none", ["ALL"])
    assert engine.containers == {}, "BUG: the container was not removed"
    events = [e for e in cd.get("/api/audit/recent?limit=20").json() if e["event"] == "tool.docker_exec"]
    assert events[0]["detail"]["agent_id"] == agent and events[0]["detail"]["image"] == "debian:bookworm-slim"


def test_the_deadline_kills_and_removes_the_container(cd, engine) -> None:
    agent = spawn(cd, SHELL)
    result = call(cd, agent, "docker_exec", command="echo started && sleep 30")
    assert result == "timed out after 1.5s; the container was killed\nstarted\n"
    assert engine.containers == {}
    calls = [(r["method"], r["path"].split("/")[-1]) for r in engine.requests[-6:]]
    cid = engine.requests[-1]["path"].split("/")[-1]
    assert calls == [("POST", "start"), ("POST", "wait"), ("POST", "kill"), ("GET", "logs"), ("GET", "json"),
                     ("DELETE", cid)]
