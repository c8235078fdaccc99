"""What the channel file tests share: one daemon with a small file cap and an agent called
`filer`, a host off every platform that must never be asked for anything, and readers of
what the model was sent."""

from __future__ import annotations

import base64
import json
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
from flask import Flask

from channel_contract import ENV
from channel_fixtures import configure, remove, start_channel_daemon, wait_active
from fakellm import TINY_PNG
from fakes.http import FakeServer

LIMIT = 4096
FILER = 'name = "filer"\n[model]\nprovider = "default"\nmodel = "default"\n'
IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(TINY_PNG).decode()}}


def start_files_daemon(directory, fake_llm, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """A daemon taking files up to LIMIT bytes, with `filer` (on the fake's default model) as
    `daemon.filer`."""
    daemon = start_channel_daemon(directory, fake_llm, env=env or ENV,
                                  extra_config=f"\n[channels]\nmax_file_bytes = {LIMIT}\n")
    created = daemon.post("/api/agents", json={"manifest_toml": FILER})
    assert created.status_code == 201, created.text
    daemon.filer = created.json()["agent_id"]
    return daemon


@pytest.fixture(scope="module")
def files_daemon(tmp_path_factory, fake_llm):
    daemon = start_files_daemon(tmp_path_factory.mktemp("channel-files"), fake_llm)
    yield daemon
    daemon.stop()


@contextmanager
def serving(daemon, name: str, fake: FakeServer, **settings: Any) -> Iterator[FakeServer]:  # type: ignore
    """Channel `name` on `daemon`, answering as `filer`, against the started `fake` for the block;
    the channel is removed and the fake stopped after it."""
    try:
        configure(daemon, name, default_agent="filer", **settings)
        wait_active(daemon, name)
        yield fake
    finally:
        remove(daemon, name)
        fake.stop()


class Elsewhere(FakeServer):
    """A host that is not the platform's: it must never be asked for anything."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        app = Flask("elsewhere")

        @app.route("/<path:path>")
        def anything(path: str):
            self.hits.append(path)
            return TINY_PNG, 200, {"Content-Type": "image/png"}

        super().__init__(app)


@pytest.fixture(scope="module")
def elsewhere():
    server = Elsewhere().start()
    yield server
    server.stop()


def refusal(name: str, server: FakeServer) -> str:
    """What the sender is told of a file linked off the platform's hosts, on `server`."""
    return f"Sorry, I could not take {name}: it is not hosted by the platform (127.0.0.1:{server.port})."


def draw(prompt: str = "a red square") -> str:
    """A message on which the fake model makes one image with the image tool."""
    return f'[[tool:image_generate {{"prompt": "{prompt}", "model": "dall-e-2"}}]] draw'


def read_it(name: str) -> str:
    """A message on which the fake model reads the inbound file `name` with file_read."""
    return f'[[tool:file_read {{"path": "inbox/{name}"}}]] read it'


def user_turns(fake_llm, marker: str) -> list[Any]:
    """The last user message of every chat call whose request mentions `marker`."""
    return [r["json"]["messages"][-1]["content"] for r in list(fake_llm.requests)
            if r["path"] == "/v1/chat/completions" and marker in json.dumps(r["json"])
            and r["json"]["messages"][-1]["role"] == "user"]


def tool_results(fake_llm, marker: str) -> list[str]:
    return [m["content"] for r in list(fake_llm.requests) if r["path"] == "/v1/chat/completions"
            for m in r["json"]["messages"] if m["role"] == "tool" and marker in json.dumps(m)]


def uploads_named(daemon, name: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return [u for u in daemon.get(f"/api/agents/{daemon.filer}/uploads").json() if u["filename"] == name]


def upload_bytes(daemon, name: str) -> bytes:  # type: ignore[no-untyped-def]
    """The one upload called `name`, as the agent's uploads API serves it."""
    [upload] = uploads_named(daemon, name)
    return daemon.get(f"/api/agents/{daemon.filer}/uploads/{upload['file_id']}").content


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"
