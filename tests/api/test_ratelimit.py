"""GCRA limiter arithmetic with a controlled clock."""

from agentd.api.ratelimit import GcraLimiter
from support import Clock


def test_burst_then_refuse_then_refill() -> None:
    clock = Clock(100.0)
    limiter = GcraLimiter(rate=10, burst=5, clock=clock)
    decisions = [limiter.hit("a") for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    refused = decisions[-1]
    assert 0 < refused.retry_after <= 0.1 + 1e-9
    clock.now += refused.retry_after
    assert limiter.hit("a").allowed
    assert not limiter.hit("a").allowed


def test_clients_are_independent() -> None:
    limiter = GcraLimiter(rate=1, burst=1, clock=Clock(100.0))
    assert limiter.hit("a").allowed
    assert not limiter.hit("a").allowed
    assert limiter.hit("b").allowed


def test_steady_rate_is_sustained() -> None:
    clock = Clock(100.0)
    limiter = GcraLimiter(rate=30, burst=2, clock=clock)
    allowed = 0
    for _ in range(300):  # ten seconds at 30/s
        clock.now += 1 / 30
        allowed += limiter.hit("a").allowed
    assert allowed == 300


def test_reset_after_reports_time_to_full_bucket() -> None:
    clock = Clock(100.0)
    limiter = GcraLimiter(rate=10, burst=10, clock=clock)
    for _ in range(10):
        last = limiter.hit("a")
    assert abs(last.reset_after - 1.0) < 1e-9
