"""Tool calls through the real daemon: an agent, and one run in which the fake LLM calls a tool."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from support import Daemon

SHELL = '[capabilities]\nshell = ["*"]\n'
MODEL = '[model]\nprovider = "default"\nmodel = "default"\n'


def spawn(d: Daemon, extra: str = SHELL, name: str = "") -> str:
    name = name or f"p-{uuid.uuid4().hex[:8]}"
    r = d.post("/api/agents", json={"manifest_toml": f'name = "{name}"\n{extra}\n{MODEL}'})
    assert r.status_code == 201, r.text
    return r.json()["agent_id"]


def call(d: Daemon, agent_id: str, name: str, **args) -> str:
    """One run in which the model calls `name(args)`; the tool's result as the model saw it."""
    r = d.post(f"/api/agents/{agent_id}/message",
               json={"message": f"[[tool:{name} {json.dumps(args)}]]"})
    assert r.status_code == 200, r.text
    text = r.json()["response"]
    assert text.startswith("tool said: "), text
    return text[len("tool said: "):]


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
