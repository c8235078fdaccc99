"""The vector index's product over big matrices is split across two threads
(memory/vectors.py `scores_of`): the split must give exactly the one-thread result, for
odd row counts, and a search must find winners in either half."""

from __future__ import annotations

import numpy as np
from agentd.memory import vectors
from agentd.memory.vectors import PARALLEL_ROWS, AgentIndex, scores_of
import os
import threading
from concurrent.futures import ThreadPoolExecutor
import pytest
from agentd.memory.vectors import GROW_ROWS, PARALLEL_ROWS, AgentIndex, Hit, scores_of


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


E = np.eye(8, dtype=np.float32)


def ids_of(index: AgentIndex, keep: np.ndarray | None) -> list[str]:
    assert keep is not None
    return [index.ids[i] for i in np.flatnonzero(keep)]


def test_new_index_and_growth() -> None:
    index = AgentIndex(8, capacity=2)
    assert len(index) == 0 and index.vectors.shape == (2, 8) and index.dimensions == 8
    assert index.search(E[0], 3) == [] and index.mask() is None
    for i in range(5):
        index.put(f"f{i}", E[i], created=float(i), confidence=0.5, source="system", scope="s")
    assert len(index) == 5 and index.vectors.shape[0] == 10  # 2 -> 10: GROW_ROWS more
    assert index.created.shape[0] == index.vectors.shape[0] == index.confidence.shape[0] == \
        index.source.shape[0] == index.scope.shape[0]
    assert index.created[:5].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [h.id for h in index.search(E[4], 1)] == ["f4"]
    assert AgentIndex(8).vectors.shape == (4, 8)


def test_growth_takes_an_eighth_more_or_what_is_needed() -> None:
    index = AgentIndex(2, capacity=4)
    index._grow(4)
    assert index.vectors.shape[0] == 4
    index._grow(5)
    assert index.vectors.shape[0] == 12  # GROW_ROWS at the least
    big = AgentIndex(2, capacity=800)
    big._grow(801)
    assert big.vectors.shape[0] == 900  # an eighth more, not twice
    big._grow(5000)
    assert big.vectors.shape[0] == 5000
    index._grow(20)
    assert index.vectors.shape[0] == 20
    assert index.source.dtype == np.int8 and index.scope.dtype == np.int32 and index.created.dtype == np.float64


def test_put_replaces_in_place_and_versions_change() -> None:
    index = AgentIndex(8)
    v0 = index.version
    index.put("a", E[0], created=1.0, confidence=0.5, source="document", scope="x")
    v1 = index.version
    index.put("a", E[1], created=2.0, confidence=0.75, source="system", scope="y")
    assert len(index) == 1 and index.pos == {"a": 0} and index.ids == ["a"]
    assert index.vectors[0].tolist() == E[1].tolist() and index.created[0] == 2.0 and index.confidence[0] == 0.75
    assert ids_of(index, index.mask(source="system", scope="y")) == ["a"]
    assert index.scope_codes == {"x": 0, "y": 1}
    index.set_confidence("a", 0.25)
    v3 = index.version
    index.set_confidence("missing", 0.9)
    index.remove("missing")
    assert len({v0, v1, v3, index.version}) == 4
    assert index.confidence[0] == 0.25
    index.put("u", E[2], created=3.0, confidence=1.0, source="unknown", scope="x")
    assert index.source[1] == -1 and ids_of(index, index.mask(source="document")) == []


def test_bulk_appends_rows() -> None:
    index = AgentIndex(8, capacity=1)
    index.put("x", E[7], created=9.0, confidence=0.1, source="system", scope="s")
    v = index.version
    index.bulk(["a", "b"], E[[0, 1]], iter([1.0, 2.0]), iter([0.5, 0.75]), ["document", "inference"], ["s", "t"])
    assert index.version != v
    assert index.ids == ["x", "a", "b"] and index.pos == {"x": 0, "a": 1, "b": 2}
    assert index.created[:3].tolist() == [9.0, 1.0, 2.0]
    assert index.confidence[:3].tolist() == pytest.approx([0.1, 0.5, 0.75])
    assert ids_of(index, index.mask(source="inference")) == ["b"]
    assert ids_of(index, index.mask(scope="s")) == ["x", "a"]
    assert [h.id for h in index.search(E[1], 1)] == ["b"]


def test_remove_moves_the_last_row() -> None:
    index = AgentIndex(8)
    for i, (src, scope) in enumerate([("system", "a"), ("document", "b"), ("observation", "c")]):
        index.put(f"f{i}", E[i], created=10.0 + i, confidence=0.1 * (i + 1), source=src, scope=scope)
    index.remove("f0")
    assert index.ids == ["f2", "f1"] and index.pos == {"f2": 0, "f1": 1}
    assert index.vectors[0].tolist() == E[2].tolist() and index.created[0] == 12.0
    assert index.confidence[0] == pytest.approx(0.3) and ids_of(index, index.mask(source="observation")) == ["f2"]
    assert ids_of(index, index.mask(scope="c")) == ["f2"]
    index.remove("f1")  # the last row: nothing moves
    assert index.ids == ["f2"] and index.pos == {"f2": 0}
    index.remove("f2")
    assert len(index) == 0 and index.search(E[2], 1) == []


def test_mask_boundaries() -> None:
    index = AgentIndex(8)
    for i in range(4):
        index.put(f"f{i}", E[i], created=100.0 + i, confidence=0.25 * (i + 1), source="system", scope="s")
    assert ids_of(index, index.mask(min_confidence=0.5)) == ["f1", "f2", "f3"], "min_confidence is inclusive"
    assert ids_of(index, index.mask(min_confidence=0.50001)) == ["f2", "f3"]
    assert ids_of(index, index.mask(after=101.0)) == ["f2", "f3"], "after is exclusive"
    assert ids_of(index, index.mask(before=102.0)) == ["f0", "f1"], "before is exclusive"
    assert ids_of(index, index.mask(after=100.5, before=102.5)) == ["f1", "f2"]
    assert ids_of(index, index.mask(only={"f3", "gone"})) == ["f3"]
    assert ids_of(index, index.mask(only=set())) == []
    assert ids_of(index, index.mask(scope="other")) == []
    assert ids_of(index, index.mask(source="document")) == []
    assert ids_of(index, index.mask(source="system", scope="s", min_confidence=0.75, after=102.5)) == ["f3"]
    assert index.mask(after=0.0).dtype == bool and index.mask(after=0.0).shape == (4,)


def test_search_order_ties_and_paths() -> None:
    index = AgentIndex(8)
    q = np.array([1, 1, 0, 0, 0, 0, 0, 0], dtype=np.float32) / np.sqrt(2)
    vecs = {"a": E[0], "b": E[1], "c": E[2], "d": (E[0] + E[2]) / np.sqrt(2)}
    for i, (fid, v) in enumerate(vecs.items()):
        index.put(fid, v, created=float(i), confidence=1.0, source="system", scope="s" if fid != "c" else "t")
    hits = index.search(q, 4)
    assert [h.id for h in hits] == ["a", "b", "d", "c"], "ties keep row order"
    assert [round(h.score, 6) for h in hits] == [0.707107, 0.707107, 0.5, 0.0]
    assert hits[2] == Hit("d", hits[2].score, 3.0)
    assert sorted(h.id for h in index.search(q, 2)) == ["a", "b"]  # the two best, in either order
    assert index.search(q, 0) == [] and index.search(q, -1) == []
    assert [h.id for h in index.search(q, 10)] == ["a", "b", "d", "c"]
    # Filtered: most rows pass (full product) and few pass (subset product) give the same hits.
    many = index.mask(scope="s")
    assert [h.id for h in index.search(q, 3, many)] == ["a", "b", "d"]
    few = index.mask(only={"d"})
    assert [(h.id, round(h.score, 6), h.created) for h in index.search(q, 3, few)] == [("d", 0.5, 3.0)]
    assert index.search(q, 3, index.mask(only=set())) == []


def test_subset_path_with_a_quarter_or_less_of_the_rows() -> None:
    index = AgentIndex(8)
    for i in range(8):
        index.put(f"f{i}", E[i], created=float(i), confidence=1.0, source="system", scope="s")
    q = (E[5] * 0.8 + E[6] * 0.6).astype(np.float32)
    two = index.mask(only={"f5", "f6"})   # 2 of 8 rows: the subset product
    three = index.mask(only={"f5", "f6", "f0"})   # 3 of 8: the full product
    assert [(h.id, round(h.score, 6)) for h in index.search(q, 5, two)] == [("f5", 0.8), ("f6", 0.6)]
    assert [(h.id, round(h.score, 6)) for h in index.search(q, 5, three)] == [("f5", 0.8), ("f6", 0.6), ("f0", 0.0)]
    assert [h.id for h in index.search(q, 1, two)] == ["f5"]


def test_similar_is_per_scope_and_excludes() -> None:
    index = AgentIndex(8)
    for i in range(10):
        index.put(f"f{i}", (E[0] * (1 - 0.01 * i) + E[1] * 0.1 * i).astype(np.float32), created=float(i),
                  confidence=1.0, source="system", scope="s" if i != 1 else "t")
    hits = index.similar(E[0], "s")
    assert len(hits) == 8, "the 8 best of the scope"
    assert "f1" not in [h.id for h in hits] and hits[0].id == "f0"
    assert [h.id for h in index.similar(E[0], "s", exclude="f0")][0] == "f2"
    assert len(index.similar(E[0], "s", exclude="f0")) == 7
    assert [h.id for h in index.similar(E[0], "t")] == ["f1"]
    assert index.similar(E[0], "none") == []


def test_split_product_threshold() -> None:
    assert PARALLEL_ROWS == 32768
    rng = np.random.default_rng(3)
    q = rng.standard_normal(4).astype(np.float32)
    for rows in (PARALLEL_ROWS - 1, PARALLEL_ROWS):
        m = rng.standard_normal((rows, 4)).astype(np.float32)
        assert np.array_equal(scores_of(m, q), m @ q)
    if (vectors.os.cpu_count() or 1) > 1:
        assert vectors._second_core() is vectors._second_core() is not None


class RecordingHelper(ThreadPoolExecutor):
    """A real one-thread executor that records the row count of each product handed to it."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="test-helper")
        self.rows: list[int] = []

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.rows.append(args[0].shape[0])
        return super().submit(fn, *args, **kwargs)


def test_the_lower_half_goes_to_the_helper_from_the_threshold_on(monkeypatch: pytest.MonkeyPatch) -> None:
    helper = RecordingHelper()
    monkeypatch.setattr(vectors, "_helper", helper)
    rng = np.random.default_rng(5)
    q = rng.standard_normal(4).astype(np.float32)
    try:
        small = rng.standard_normal((PARALLEL_ROWS - 1, 4)).astype(np.float32)
        assert np.array_equal(scores_of(small, q), small @ q)
        assert helper.rows == [], "BUG: a product under PARALLEL_ROWS rows was split"
        for rows in (PARALLEL_ROWS, PARALLEL_ROWS + 1):
            m = rng.standard_normal((rows, 4)).astype(np.float32)
            got = scores_of(m, q)
            assert got.dtype == np.float32 and np.array_equal(got, m @ q)
        assert helper.rows == [PARALLEL_ROWS // 2, PARALLEL_ROWS // 2 + 1], \
            "BUG: the helper did not get the lower half (rows half: of the matrix)"
        # A float64 query: the split product keeps numpy's result type, as the plain one does.
        q64 = q.astype(np.float64)
        got = scores_of(m, q64)
        assert got.dtype == np.float64 and np.array_equal(got, m @ q64)
    finally:
        helper.shutdown()


def test_the_helper_is_one_named_thread_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors, "_helper", None)
    made = vectors._second_core()
    try:
        if (os.cpu_count() or 1) > 1:
            assert made is not None and vectors._helper is made and vectors._second_core() is made
            assert made._max_workers == 1
            name = made.submit(lambda: threading.current_thread().name).result()
            assert name.startswith("memory-scan"), name
        else:
            assert made is None
    finally:
        if made is not None:
            made.shutdown()


def test_every_write_moves_the_version_forward() -> None:
    index = AgentIndex(8)
    seen = [index.version]
    index.put("a", E[0], created=1.0, confidence=0.5, source="system", scope="s")
    seen.append(index.version)
    index.put("a", E[1], created=1.0, confidence=0.5, source="system", scope="s")
    seen.append(index.version)
    index.bulk(["b"], E[[2]], [2.0], [0.5], ["system"], ["s"])
    seen.append(index.version)
    index.set_confidence("a", 0.25)
    seen.append(index.version)
    index.remove("b")
    seen.append(index.version)
    assert all(isinstance(v, int) for v in seen) and seen == sorted(set(seen)), \
        f"BUG: a write left the version unchanged or not increasing: {seen}"
    assert AgentIndex(8).version > seen[-1], "versions never repeat across indexes"


def test_growth_from_the_smallest_capacities() -> None:
    one = AgentIndex(4, capacity=1)
    one.put("a", np.ones(4, dtype=np.float32), created=1.0, confidence=1.0, source="system", scope="s")
    assert one.vectors.shape == (1, 4), "BUG: grew although the row fitted"
    one.put("b", np.ones(4, dtype=np.float32), created=1.0, confidence=1.0, source="system", scope="s")
    assert one.vectors.shape == (1 + GROW_ROWS, 4)
    empty = AgentIndex(4, capacity=0)
    empty.put("a", np.ones(4, dtype=np.float32), created=1.0, confidence=1.0, source="system", scope="s")
    assert empty.vectors.shape == (GROW_ROWS, 4) and empty.ids == ["a"]


def test_unknown_filter_values_match_nothing_and_masks_are_boolean() -> None:
    index = AgentIndex(8)
    sources = ["conversation", "document", "observation", "inference"]
    for i, source in enumerate(sources):
        index.put(f"f{i}", E[i], created=float(i), confidence=0.5, source=source, scope="s")
    index.put("odd", E[5], created=9.0, confidence=0.5, source="rumour", scope="s")  # stored as -1
    assert [ids_of(index, index.mask(source=s)) for s in sources] == [["f0"], ["f1"], ["f2"], ["f3"]]
    assert ids_of(index, index.mask(source="rumour")) == [], "BUG: an unknown source matched a stored row"
    for keep in (index.mask(scope="other"), index.mask(only={"f1"}), index.mask(scope="other", min_confidence=0.1),
                 index.mask(only={"f1"}, after=0.5), index.mask(source="rumour")):
        assert keep is not None and keep.dtype == bool and keep.shape == (5,)
    assert ids_of(index, index.mask(only={"f1", "f2"}, after=1.5)) == ["f2"]


def test_search_drops_rows_under_min_score_and_keeps_one_exactly_at_it():
    index = AgentIndex(2)
    rows = np.array([[1.0, 0.0], [0.5, 0.0], [0.25, 0.0], [-1.0, 0.0]], dtype=np.float32)
    index.bulk(["a", "b", "c", "d"], rows, created=[1.0, 2.0, 3.0, 4.0], confidence=[1.0] * 4,
               sources=["user_provided"] * 4, scopes=["semantic"] * 4)
    query = np.array([1.0, 0.0], dtype=np.float32)
    assert [(h.id, h.score, h.created) for h in index.search(query, 4)] == [
        ("a", 1.0, 1.0), ("b", 0.5, 2.0), ("c", 0.25, 3.0), ("d", -1.0, 4.0)]
    assert [h.id for h in index.search(query, 4, min_score=0.5)] == ["a", "b"]
    assert [h.id for h in index.search(query, 1, min_score=0.5)] == ["a"]
    assert index.search(query, 4, min_score=1.5) == []
    keep = np.array([False, True, True, True])
    assert [h.id for h in index.search(query, 4, keep, min_score=0.25)] == ["b", "c"]
    assert [h.id for h in index.similar(query, "semantic", exclude="a", min_score=0.3)] == ["b"]
