"""The query-vector cache (agentd/memory/querycache.py): hits and misses, keys per model,
read-only copies, least-recently-used eviction at exactly its size."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from agentd.memory.querycache import QUERY_CACHE_SIZE, QueryCache


class Counting:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(texts)
        return np.array([[float(len(texts[0])), 1.0]], dtype=np.float32)


def test_query_cache_hits_misses_and_keys() -> None:
    assert QUERY_CACHE_SIZE == 256 and QueryCache().size == 256
    cache, embed = QueryCache(), Counting()
    v = cache.get("m1", "abc", embed)
    assert v.tolist() == [3.0, 1.0] and not v.flags.writeable
    assert cache.get("m1", "abc", embed) is v
    assert (cache.hits, cache.misses) == (1, 1) and embed.calls == [["abc"]]
    cache.get("m2", "abc", embed)  # another model: another entry
    assert (cache.hits, cache.misses) == (1, 2) and embed.calls == [["abc"], ["abc"]]
    cache.clear()
    cache.get("m1", "abc", embed)
    assert (cache.hits, cache.misses) == (1, 3)


def test_query_cache_vector_is_a_read_only_copy() -> None:
    source = np.array([[1.0, 2.0]], dtype=np.float32)
    cache = QueryCache()
    v = cache.get("m", "t", lambda texts: source)
    source[0, 0] = 9.0
    assert v.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError):
        v[0] = 5.0


def test_query_cache_evicts_the_least_recently_used() -> None:
    cache, embed = QueryCache(size=2), Counting()
    cache.get("m", "a", embed)
    cache.get("m", "bb", embed)
    cache.get("m", "a", embed)       # "a" is now the most recent
    cache.get("m", "ccc", embed)     # evicts "bb"
    assert embed.calls == [["a"], ["bb"], ["ccc"]]
    cache.get("m", "a", embed)
    cache.get("m", "ccc", embed)
    assert embed.calls == [["a"], ["bb"], ["ccc"]], "BUG: the recently used entry was evicted"
    cache.get("m", "bb", embed)
    assert embed.calls[-1] == ["bb"] and len(embed.calls) == 4
    cache.get("m", "a", embed)       # evicted by "bb" (least recent of a, ccc after a, ccc)
    assert len(embed.calls) == 5


def test_query_cache_keeps_exactly_size_entries() -> None:
    cache, embed = QueryCache(size=3), Counting()
    for t in ("a", "b", "c"):
        cache.get("m", t, embed)
    for t in ("a", "b", "c"):
        cache.get("m", t, embed)
    assert len(embed.calls) == 3 and cache.hits == 3


def test_query_cache_is_shared_across_threads() -> None:
    cache, embed = QueryCache(), Counting()
    out: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: out.append(cache.get("m", "q", embed))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 4 and all(v.tolist() == [1.0, 1.0] for v in out)
    assert cache.hits + cache.misses == 4
