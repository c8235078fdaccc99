"""Freed heap memory is handed back at most once a second."""

from __future__ import annotations

from agentd.memory.trim import Trimmer


def test_trims_at_most_once_per_interval() -> None:
    calls: list[int] = []
    trimmer = Trimmer(every=60.0)
    trimmer._trim = calls.append
    trimmer()
    trimmer()
    assert calls == [0]
    trimmer.every = 0.0
    trimmer()
    assert calls == [0, 0]


def test_the_real_call_runs() -> None:
    Trimmer(every=0.0)()  # glibc's malloc_trim, or nothing where there is none
