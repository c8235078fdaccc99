"""The vector index's product over big matrices is split across two threads
(memory/vectors.py `scores_of`): the split must give exactly the one-thread result, for
odd row counts, and a search must find winners in either half."""

from __future__ import annotations

import numpy as np

from agentd.memory import vectors
from agentd.memory.vectors import PARALLEL_ROWS, AgentIndex, scores_of


def test_split_product_equals_the_plain_product_for_odd_sizes():
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((PARALLEL_ROWS * 2 + 1, 8)).astype(np.float32)
    query = rng.standard_normal(8).astype(np.float32)
    split = scores_of(matrix, query)
    assert split.dtype == np.float32 and split.shape == (PARALLEL_ROWS * 2 + 1,)
    assert np.array_equal(split, matrix @ query)
    assert vectors._helper is not None  # the helper thread was really used


def test_search_over_a_big_index_finds_winners_in_both_halves():
    rng = np.random.default_rng(11)
    n = PARALLEL_ROWS + 5
    index = AgentIndex(8, capacity=n)
    noise = rng.standard_normal((n, 8)).astype(np.float32) * 0.01
    noise[:, 0] = 0.0
    query = np.zeros(8, dtype=np.float32)
    query[0] = 1.0
    noise[3, 0], noise[n - 2, 0] = 0.9, 0.8  # one planted winner in each half
    index.bulk([f"f{i}" for i in range(n)], noise, created=np.arange(n, dtype=np.float64),
               confidence=np.ones(n), sources=["user_provided"] * n, scopes=["semantic"] * n)
    hits = index.search(query, 2)
    assert [h.id for h in hits] == ["f3", f"f{n - 2}"]
    assert abs(hits[0].score - 0.9) < 1e-6 and abs(hits[1].score - 0.8) < 1e-6
