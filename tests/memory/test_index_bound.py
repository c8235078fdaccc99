"""The loaded search indexes hold at most `max_fragments` fragments in all."""

from __future__ import annotations

from pathlib import Path

import pytest

from memsupport import add_agent, add_agents, new_memory, unit


def axis(n: int):  # type: ignore[no-untyped-def]
    """Unrelated facts: orthogonal vectors (no merging, no superseding)."""
    return unit(*([0.0] * n + [1.0]))


def test_least_recently_used_indexes_are_dropped_and_read_back(tmp_path: Path) -> None:
    memory, embedder, _ = new_memory(tmp_path)
    memory.max_fragments = 4
    add_agent(memory.store, "c")
    for n, agent in enumerate(["a", "b", "c"]):
        for k in range(2):
            text = f"{agent} fact {k}"
            embedder.vectors[text] = axis(n * 2 + k)
            memory.remember(agent, text)
    # Six fragments were written; only the two most recent agents' four stay loaded.
    assert memory.loaded_ids("a") is None
    assert len(memory.loaded_ids("b")) == 2 and len(memory.loaded_ids("c")) == 2
    assert memory.cached_fragments() == 4  # (caches.index_fragments.held of /api/health/detail)

    embedder.vectors["query"] = unit(1.0, 1.0)  # axes 0 and 1: "a"'s facts
    found = memory.recall("a", "query", 5, None, None)
    assert sorted(f["content"] for f in found) == ["a fact 0", "a fact 1"]
    # Reading "a" back made it the most recently used: "b" went.
    assert len(memory.loaded_ids("a")) == 2
    assert memory.loaded_ids("b") is None
    assert len(memory.loaded_ids("c")) == 2


def test_a_search_of_a_loaded_index_makes_it_the_most_recently_used(tmp_path: Path) -> None:
    memory, embedder, _ = new_memory(tmp_path)
    memory.max_fragments = 4
    add_agent(memory.store, "c")
    for n, agent in enumerate(["a", "b"]):
        for k in range(2):
            embedder.vectors[f"{agent} fact {k}"] = axis(n * 2 + k)
            memory.remember(agent, f"{agent} fact {k}")
    embedder.vectors["query"] = unit(1.0, 1.0)
    assert [f["content"] for f in memory.recall("a", "query", 1, None, None)] in (["a fact 0"], ["a fact 1"])
    for k in range(2):
        embedder.vectors[f"c fact {k}"] = axis(4 + k)
        memory.remember("c", f"c fact {k}")
    # "a" was searched after "b" was written: "b" is the least recently used and went.
    assert memory.loaded_ids("b") is None
    assert len(memory.loaded_ids("a")) == 2 and len(memory.loaded_ids("c")) == 2


@pytest.mark.parametrize("write", ["remember", "remember_many", "remember_groups"])
def test_an_index_larger_than_the_bound_is_kept_while_in_use(tmp_path: Path, write: str) -> None:
    memory, embedder, _ = new_memory(tmp_path)
    memory.max_fragments = 2
    add_agents(memory.store, ("big", "small"))

    def remember(agent: str, text: str) -> None:
        if write == "remember_many":
            memory.remember_many(agent, [{"content": text}])
        elif write == "remember_groups":
            memory.remember_groups([(agent, [{"content": text}], [embedder.vectors[text]])])
        else:
            memory.remember(agent, text)

    embedder.vectors["first"] = axis(6)
    remember("small", "first")
    for k in range(3):
        embedder.vectors[f"fact {k}"] = axis(k)
        remember("big", f"fact {k}")
    # "big" grew past the bound as it was written: the other index went, "big" stays.
    assert memory.loaded_ids("small") is None
    assert len(memory.loaded_ids("big")) == 3
    memory.invalidate("big")  # read back from the store, it stays too (not read again at each search)
    memory.index("big")
    assert len(memory.loaded_ids("big")) == 3
    embedder.vectors["other"] = axis(5)
    remember("small", "other")
    assert memory.loaded_ids("big") is None
    assert memory.loaded_ids("small") is not None


def test_indexes_of_agents_with_one_fragment_take_about_the_bound_in_rows(tmp_path: Path) -> None:
    # The bound counts fragments; what an index holds in memory is its allocated rows. Agents
    # with one fragment each must not cost a large first allocation apiece.
    memory, embedder, _ = new_memory(tmp_path)
    memory.max_fragments = 40
    add_agents(memory.store, [f"agent-{n}" for n in range(60)])
    for n in range(60):
        text = f"agent {n}'s only fact"
        embedder.vectors[text] = axis(n % 7)
        memory.remember(f"agent-{n}", text)
    loaded = [memory.index(f"agent-{n}") for n in range(20, 60)]
    assert sum(len(index) for index in loaded) == 40
    assert all(memory.loaded_ids(f"agent-{n}") is None for n in range(20)), "BUG: the bound was not kept"
    rows = sum(index.vectors.shape[0] for index in loaded)
    assert rows <= 4 * 40, f"BUG: 40 one-fragment indexes hold {rows} allocated rows"


def test_an_index_read_back_and_written_to_does_not_double(tmp_path: Path) -> None:
    # The pattern of a daemon with more agents than the cache holds: an agent's index is read
    # back from the store (exactly full), then the exchange is remembered into it.
    memory, embedder, _ = new_memory(tmp_path)
    add_agent(memory.store, "agent")
    for k in range(200):
        embedder.vectors[f"fact {k}"] = axis(k % 7)
        memory.remember("agent", f"fact {k}")
    memory.invalidate("agent")
    assert memory.index("agent").vectors.shape[0] == 200
    embedder.vectors["one more"] = axis(3)
    memory.remember("agent", "one more")
    rows = memory.index("agent").vectors.shape[0]
    assert len(memory.index("agent")) == 201
    assert rows <= 201 * 1.2, f"BUG: 201 fragments in {rows} allocated rows"
