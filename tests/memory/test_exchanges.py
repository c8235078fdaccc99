"""Auto-remember's queue (agentd/memory/exchanges.py) in process: the real MemoryService on a
real SQLite store with a scripted embedder that can be held mid-run. A full queue drops the
exchange with a warning and loses nothing already queued (on a small queue: the default
thousand is the service's own test, tests/memory/test_service.py)."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from agentd.config import MemoryConfig
from agentd.memory import service as service_mod
from agentd.memory.service import MemoryService
from agentd.store import open_store

from memsupport import ScriptedEmbedder

WAIT = 20.0


class HeldEmbedder(ScriptedEmbedder):
    """Each new text gets its own axis; `gate`, when set, holds each model run until opened."""

    def __init__(self) -> None:
        super().__init__(dims=64)
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def embed(self, texts: list[str]) -> np.ndarray:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(WAIT)
        for text in texts:
            if text not in self.vectors:
                v = np.zeros(self.dims, dtype=np.float32)
                v[len(self.vectors) % self.dims] = 1.0
                self.vectors[text] = v
        return super().embed(texts)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("exchanges") / "agentd.db")
    yield s
    s.close()


@pytest.fixture()
def small_queue(store, monkeypatch):
    monkeypatch.setattr(service_mod, "QUEUE_LIMIT", 3)
    svc = MemoryService(MemoryConfig(), store)
    svc._embedder = svc.emb = HeldEmbedder()  # type: ignore[attr-defined]
    yield svc
    svc.close()


def test_a_full_queue_drops_the_exchange_with_a_warning_and_keeps_the_queued_ones(small_queue, caplog) -> None:
    svc = small_queue
    a = str(uuid.uuid4())
    svc.emb.gate = threading.Event()
    svc.after_exchange(a, "s", "first", "one")          # taken by the worker, held in the model
    assert svc.emb.entered.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="agentd.memory"):
        for i in range(3):
            svc.after_exchange(a, "s", f"q{i}", f"a{i}")
        assert caplog.records == []
        svc.after_exchange(a, "s", "one too many", "a")  # never blocks, never raises
        svc.after_exchange(a, "s", "", "")               # (blank: not queued, no warning)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == \
        [(logging.WARNING, f"memory queue full; exchange of agent {a} not remembered")]
    svc.emb.gate.set()
    svc.drain()
    contents = sorted(m["content"] for m in svc.page(a, 10, 0)["memories"])
    assert contents == ["User asked: first\nI responded: one", "User asked: q0\nI responded: a0",
                        "User asked: q1\nI responded: a1", "User asked: q2\nI responded: a2"]
