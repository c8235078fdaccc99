"""Per-sender channel rate limits forget senders that went quiet."""

from __future__ import annotations

from agentd.channels import overrides
from agentd.channels.overrides import SenderLimits


def test_quiet_senders_are_swept_and_active_ones_still_limited(monkeypatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(overrides.time, "monotonic", lambda: now[0])
    limits = SenderLimits(window=60.0)
    for n in range(overrides.SWEEP_EVERY - 1):
        assert limits.allow("webhook", f"sender-{n}", 5)
    assert len(limits._seen) == overrides.SWEEP_EVERY - 1
    now[0] += 61.0  # everyone went quiet for a window
    assert limits.allow("webhook", "active", 2)  # this call sweeps
    assert list(limits._seen) == [("webhook", "active")]
    assert limits.allow("webhook", "active", 2)
    assert not limits.allow("webhook", "active", 2)
