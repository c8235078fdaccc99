"""Freed heap memory is handed back at most once a second, and after the last call of a burst."""

from __future__ import annotations

import time

from agentd.memory.trim import Trimmer


def test_trims_at_most_once_per_interval() -> None:
    calls: list[int] = []
    trimmer = Trimmer(every=60.0)
    trimmer._trim = calls.append
    trimmer()
    trimmer()
    trimmer()
    assert calls == [0]
    assert trimmer._later is not None, "BUG: the calls that came too soon are not made up later"
    trimmer._later.cancel()
    trimmer._later = None
    trimmer.every = 0.0
    trimmer()
    assert calls == [0, 0]


def test_a_call_too_soon_is_made_up_once_after_the_interval() -> None:
    calls: list[float] = []
    trimmer = Trimmer(every=0.3)
    trimmer._trim = lambda pad: calls.append(time.monotonic())
    trimmer()
    first = calls[0]
    for _ in range(5):
        trimmer()  # a burst: one trim owed, not five
    assert len(calls) == 1
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.4)  # room for a wrongly owed third
    assert len(calls) == 2, f"BUG: {len(calls) - 1} trims after the burst, wanted 1"
    assert calls[1] - first >= 0.3 - 0.01
    assert trimmer._later is None


def test_the_real_call_runs() -> None:
    Trimmer(every=0.0)()  # glibc's malloc_trim, or nothing where there is none
