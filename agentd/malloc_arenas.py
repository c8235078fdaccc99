"""Cap the number of glibc malloc arenas the daemon's threads may use.

glibc gives each new thread that allocates an arena of its own, up to eight per core, and
memory freed in an arena stays with that arena. With dozens of server threads and
embedding work on several of them, each arena keeps the high-water mark of what was done
on it, so RSS wanders by tens of MB between quiet moments. A small cap keeps the heap in
few arenas, where freed memory is reused by the next request on any thread.

`mallopt(M_ARENA_MAX, n)` must run before the threads start: arenas already made stay.
glibc reads `MALLOC_ARENA_MAX` from the environment only when malloc starts, so the
daemon cannot set that for itself; an explicit `MALLOC_ARENA_MAX` in the environment wins
over the config key. Off glibc (musl, macOS) nothing is done.
"""

from __future__ import annotations

import os

M_ARENA_MAX = -8  # glibc's malloc.h

_applied: int | None = None


def _mallopt():  # type: ignore[no-untyped-def]
    import ctypes

    try:
        # The running process's own symbols: no library search (find_library runs programs).
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def cap_arenas(count: int) -> int | None:
    """Limit malloc to `count` arenas (0: glibc's default). Returns the cap in effect: `count`,
    the environment's `MALLOC_ARENA_MAX`, or None when glibc's default stays (count 0, or no
    glibc)."""
    global _applied
    _applied = None
    mallopt = _mallopt()
    if mallopt is None:
        return None
    from_env = os.environ.get("MALLOC_ARENA_MAX", "").strip()
    if from_env.isdigit() and int(from_env) > 0:
        _applied = int(from_env)
    elif count > 0 and mallopt(M_ARENA_MAX, count) == 1:
        _applied = count
    return _applied


def applied() -> int | None:
    """The cap `cap_arenas` put in effect (None: glibc's default)."""
    return _applied
