"""agentd/api/middleware.py: near misses of the loopback check that the table in
test_core_exact.py does not cover (addresses with text around them, scope ids)."""

from __future__ import annotations

import pytest

from agentd.api.middleware import is_loopback


@pytest.mark.parametrize("addr, expected", [
    ("::1%lo", True), ("::1%1", True), ("::ffff:127.0.0.1%lo", True), ("fe80::1%lo", False),
    # A REMOTE_ADDR that is no address (a forwarded hop token) is never loopback, even when
    # it starts like one.
    ("127.0.0.1 evil", False), ("127.0.0.1%lo", False), ("127.0.0.1, 203.0.113.7", False),
    (" 127.0.0.1", False), ("127.0.0.1:80", False), ("[::1]", False), ("unknown", False),
])
def test_loopback_near_misses(addr: str, expected: bool) -> None:
    assert is_loopback(addr) is expected, f"BUG: {addr!r} judged {'not ' if expected else ''}loopback"
