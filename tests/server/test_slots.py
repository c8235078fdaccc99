"""agentd/server/slots.py: the cap on requests holding a server thread, with a share for runs that start now."""

from __future__ import annotations

import pytest

from agentd.server.slots import Slots


def test_a_quarter_is_kept_for_requests_that_run_at_once() -> None:
    slots = Slots(8)
    assert (slots.total, slots.reserve, slots.in_use) == (8, 2, 0)
    assert all(slots.acquire(blocking=False, waiting=True) for _ in range(6))
    assert slots.acquire(waiting=True) is False, "waiting requests stop at total - reserve"
    assert slots.acquire() and slots.acquire(), "the reserve is for requests whose agent is idle"
    assert slots.acquire() is False and slots.in_use == 8
    slots.release()
    assert slots.acquire(waiting=True) is False and slots.acquire() is True


def test_release_is_bounded_like_a_bounded_semaphore() -> None:
    slots = Slots(3)
    assert slots.acquire()
    slots.release()
    with pytest.raises(ValueError, match="^Slots released too many times$"):
        slots.release()
    assert slots.in_use == 0


@pytest.mark.parametrize("total, reserve", [(1, 0), (3, 0), (4, 1), (96, 24), (220, 55)])
def test_the_reserve_is_a_quarter_rounded_down(total: int, reserve: int) -> None:
    assert Slots(total).reserve == reserve
