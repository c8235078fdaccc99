"""glibc malloc settings the daemon applies at start: how many arenas its threads share, and
a fixed mmap threshold.

glibc gives each new thread that allocates an arena of its own, up to eight per core, and
memory freed in an arena stays with that arena. With dozens of server threads and
embedding work on several of them, each arena keeps the high-water mark of what was done
on it, so RSS wanders by tens of MB between quiet moments. A small cap keeps the heap in
few arenas, where freed memory is reused by the next request on any thread.

glibc also raises its mmap threshold each time a mapped block is freed (up to 32 MiB), so
after the first large scratch buffers (embedding batches, index arrays rebuilt on a recall)
later ones of that size come from the heap, where they fragment it and are rarely handed
back. A fixed threshold keeps every block above it mapped and unmapped on free.

Both must be set before the threads start: arenas already made stay. glibc reads
`MALLOC_ARENA_MAX` and `MALLOC_MMAP_THRESHOLD_` from the environment only when malloc starts,
so the daemon cannot set those for itself; either one in the environment wins over its config
key. Off glibc (musl, macOS) nothing is done.
"""

from __future__ import annotations

import os

# glibc's malloc.h
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

_applied: dict[str, int | None] = {"arenas": None, "mmap_threshold": None}


def _mallopt():  # type: ignore[no-untyped-def]
    import ctypes

    try:
        # The running process's own symbols: no library search (find_library runs programs).
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None


def _set(mallopt, option: int, value: int, env: str) -> int | None:  # type: ignore[no-untyped-def]
    """`value` for `option` (0: glibc's default), unless the environment's `env` set it; the
    value in effect, None for glibc's default."""
    from_env = os.environ.get(env, "").strip()
    if from_env.isdigit() and int(from_env) > 0:
        return int(from_env)
    if value > 0 and mallopt(option, value) == 1:
        return value
    return None


def tune_malloc(arenas: int, mmap_threshold_kb: int) -> dict[str, int | None]:
    """Cap malloc at `arenas` arenas and fix its mmap threshold at `mmap_threshold_kb` KiB (0
    for either: glibc's default). Returns what is in effect (see `applied`)."""
    mallopt = _mallopt()
    if mallopt is None:
        _applied.update(arenas=None, mmap_threshold=None)
    else:
        _applied["arenas"] = _set(mallopt, M_ARENA_MAX, arenas, "MALLOC_ARENA_MAX")
        _applied["mmap_threshold"] = _set(mallopt, M_MMAP_THRESHOLD, mmap_threshold_kb * 1024,
                                          "MALLOC_MMAP_THRESHOLD_")
    return applied()


def applied() -> dict[str, int | None]:
    """`arenas`: the arena cap in effect; `mmap_threshold`: the fixed threshold in bytes; None
    for glibc's default."""
    return dict(_applied)
