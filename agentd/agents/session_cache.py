"""Which conversations keep their latest messages in memory between runs.

A session's cache (`session_tail`, `llm_tail` on the handle or ConversationSession) is at
most the history window, but one is kept for every conversation that ever ran: with
thousands of agents and channel conversations that adds up. This keeps the most recently
used `limit` of them and empties the others' caches; the next run of an emptied one reads
its window back from the database.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any


class SessionCache:
    """Least-recently-used set of sessions (by session id) whose caches are kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def touch(self, session: Any) -> None:
        """`session` was just used: keep its cache, dropping the least recently used beyond
        the limit."""
        key = session.session_id
        with self._lock:
            self._held[key] = session
            self._held.move_to_end(key)
            while len(self._held) > self.limit:
                old_key, old = self._held.popitem(last=False)
                # (A reset gives the handle a new session id: its cache is that session's now.)
                if old.session_id == old_key and old is not session:
                    old.session_tail = None
                    old.llm_tail = {}
