"""How much heap SQLite holds in this process (every connection's page cache, schema and
prepared statements), for GET /api/health/detail."""

from __future__ import annotations

import ctypes
from typing import Any

_SQLITE_STATUS_MEMORY_USED = 0
_status: Any = None  # sqlite3_status64, found on first use; False: not available


def sqlite_heap_kib() -> int | None:
    """KiB SQLite has allocated and not freed, or None when its library does not say."""
    global _status
    if _status is None:
        try:
            import _sqlite3

            # The library the sqlite3 module itself uses: no second copy with counts of its own.
            _status = ctypes.CDLL(_sqlite3.__file__).sqlite3_status64
            _status.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                ctypes.c_int]
        except (OSError, AttributeError, ImportError):
            _status = False
    if not _status:
        return None
    used, highest = ctypes.c_int64(), ctypes.c_int64()
    if _status(_SQLITE_STATUS_MEMORY_USED, ctypes.byref(used), ctypes.byref(highest), 0) != 0:
        return None
    return used.value // 1024
