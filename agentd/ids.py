"""Identifiers made on every message: request ids, run ids, completion ids.

`uuid.uuid4()` reads the operating system's random source, a system call for each id, and
a message made three of them. These ids name things and guard nothing (access is the API
key's job), so they come from a generator seeded once from the OS. Anything secret (keys,
tokens, cookies) keeps using `secrets` or `uuid4`.
"""

from __future__ import annotations

import os
import random
import time
import uuid

_random = random.Random()  # seeded from os.urandom when the module loads
# A forked child must not repeat its parent's ids (`random` does the same for its own).
os.register_at_fork(after_in_child=_random.seed)


def random_uuid() -> uuid.UUID:
    """A version-4 UUID, not for secrets."""
    return uuid.UUID(int=_random.getrandbits(128), version=4)


# The version-4 bits as `uuid.UUID(int=..., version=4)` sets them: variant 10, version 0100.
_V4_CLEAR = ~(0xC000 << 48 | 0xF000 << 64)
_V4_SET = 0x8000 << 48 | 4 << 76


def random_uuid_hex() -> str:
    """`random_uuid().hex` (a request's id), without the `UUID` object a request would
    build and throw away."""
    return "%032x" % (_random.getrandbits(128) & _V4_CLEAR | _V4_SET)


def random_uuid_str() -> str:
    """`str(random_uuid())`, without the `UUID` object."""
    h = random_uuid_hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def time_ordered_uuid() -> uuid.UUID:
    """A version-7 UUID (RFC 9562), not for secrets: the Unix time in milliseconds, then
    random bits. Ids made one after another sort together, so an index keyed on them (the
    run records') grows at its end instead of changing a random page for every insert."""
    return uuid.UUID(int=_time_ordered())


def time_ordered_uuid_str() -> str:
    """`str(time_ordered_uuid())` (a run's id), without the `UUID` object."""
    h = "%032x" % _time_ordered()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _time_ordered() -> int:
    ms = time.time_ns() // 1_000_000
    return ((ms & 0xFFFF_FFFF_FFFF) << 80 | 7 << 76 | _random.getrandbits(12) << 64
            | 0b10 << 62 | _random.getrandbits(62))
