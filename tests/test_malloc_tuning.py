"""glibc malloc tuning: `[api] malloc_arenas` and `malloc_mmap_threshold_kb` reach glibc, and
the daemon says what is in effect in GET /api/health/detail, beside how full its bounded
caches are."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import LLM_ENV, llm_config
from support import FAST_API, Daemon, make_home

try:
    GLIBC = hasattr(ctypes.CDLL(None), "mallopt") and hasattr(ctypes.CDLL(None), "malloc_info")
except OSError:
    GLIBC = False

# Eight threads allocate at the same time, then the heaps glibc made are counted from
# malloc_info's XML (one <heap nr=...> per arena).
COUNT_ARENAS = textwrap.dedent("""
    import ctypes, os, sys, tempfile, threading
    from agentd.malloc_tuning import tune_malloc
    print(tune_malloc(int(sys.argv[1]), 0)["arenas"])
    barrier = threading.Barrier(8)
    def work():
        barrier.wait()
        blocks = [bytearray(4096 + i) for i in range(2000)]
        barrier.wait()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    path = os.path.join(tempfile.mkdtemp(), "info.xml")
    f = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
    print(open(path).read().count("<heap nr="))
""")


# A 1 MiB block is mapped, freed, then asked for again: mapped once more under a fixed
# threshold; from the heap once glibc's own threshold has risen past it.
MAPPED_AGAIN = textwrap.dedent("""
    import ctypes, sys
    from agentd.malloc_tuning import tune_malloc
    print(tune_malloc(0, int(sys.argv[1]))["mmap_threshold"])
    libc = ctypes.CDLL(None)
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc.mallinfo2.restype = Info
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblks
    libc.free(libc.malloc(1 << 20))
    block = libc.malloc(1 << 20)
    print(libc.mallinfo2().hblks - before)
""")


def run_script(script: str, arg: int, env: dict[str, str] | None = None) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return subprocess.run([sys.executable, "-c", script, str(arg)], capture_output=True, text=True,
                          check=True, timeout=60, env={**environ, **(env or {})}).stdout.split()


def arenas_after_threads(cap: int, env: dict[str, str] | None = None) -> tuple[str, int]:
    out = run_script(COUNT_ARENAS, cap, env)
    return out[0], int(out[1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_cap_limits_the_heaps_glibc_makes() -> None:
    assert arenas_after_threads(1) == ("1", 1)
    assert arenas_after_threads(2) == ("2", 2)
    reported, uncapped = arenas_after_threads(0)
    assert reported == "None" and uncapped > 2, "eight allocating threads get arenas of their own"
    # MALLOC_ARENA_MAX, read by glibc itself, wins over the config key and is what is reported.
    assert arenas_after_threads(2, {"MALLOC_ARENA_MAX": "1"}) == ("1", 1)


@pytest.mark.skipif(not GLIBC or not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc 2.33 or later")
def test_a_fixed_threshold_keeps_large_blocks_mapped() -> None:
    assert run_script(MAPPED_AGAIN, 128) == ["131072", "1"]
    assert run_script(MAPPED_AGAIN, 0) == ["None", "0"], "glibc's own threshold rose past the freed block"
    # MALLOC_MMAP_THRESHOLD_, read by glibc itself, wins over the config key and is reported.
    assert run_script(MAPPED_AGAIN, 0, {"MALLOC_MMAP_THRESHOLD_": "65536"}) == ["65536", "1"]


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_daemon_applies_the_configured_cap_and_reports_its_caches(tmp_path: Path, fake_llm) -> None:
    config = (FAST_API + "malloc_arenas = 1\nmalloc_mmap_threshold_kb = 0\n" + llm_config(fake_llm)[len(FAST_API):]
              + "\n[agents]\ncached_sessions = 2\n[memory]\nindex_cache_fragments = 500\n")
    configured = Daemon(make_home(tmp_path / "one", config), env_extra=LLM_ENV).start()
    default = Daemon(make_home(tmp_path / "default")).start()
    try:
        as_installed = default.get("/api/health/detail").json()
        assert (as_installed["malloc_arenas"], as_installed["malloc_mmap_threshold"]) == (2, 16384)
        health = configured.get("/api/health/detail").json()
        assert (health["malloc_arenas"], health["malloc_mmap_threshold"]) == (1, None)
        assert health["caches"] == {"sessions": {"held": 0, "bound": 2},
                                    "index_fragments": {"held": 0, "bound": 500},
                                    "query_embeddings": {"held": 0, "bound": 256}}
        for i in range(3):
            agent = configured.post("/api/agents", json={"manifest_toml": f'name = "a{i}"\n'}).json()["agent_id"]
            answer = configured.post(f"/api/agents/{agent}/message", json={"message": f"hello {i}"})
            assert answer.status_code == 200, answer.text
        # Three conversations, two kept: the least recently used one was dropped.
        caches = configured.get("/api/health/detail").json()["caches"]
        assert caches["sessions"] == {"held": 2, "bound": 2}
        assert caches["index_fragments"]["bound"] == 500
    finally:
        configured.stop()
        default.stop()


@pytest.mark.parametrize("key, value, message", [
    ("malloc_arenas", "100", "api.malloc_arenas: must be between 0 and 64"),
    ("malloc_mmap_threshold_kb", "32769", "api.malloc_mmap_threshold_kb: must be between 0 and 32768"),
    ("malloc_mmap_threshold_kb", "-1", "api.malloc_mmap_threshold_kb: must be between 0 and 32768"),
])
def test_a_bad_setting_is_refused_at_start(tmp_path: Path, key: str, value: str, message: str) -> None:
    from agentd.config import ConfigError, load_config

    home = make_home(tmp_path, f"[api]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(home)


class FakeMallopt:
    """glibc's mallopt in process: records each (option, value), answers `result` (1: done)."""

    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def __call__(self, option: int, value: int) -> int:
        self.calls.append((option, value))
        return self.result


@pytest.fixture()
def fake_mallopt(monkeypatch):
    from agentd import malloc_tuning

    for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeMallopt()
    monkeypatch.setattr(malloc_tuning, "_mallopt", lambda: fake)
    monkeypatch.setattr(malloc_tuning, "_applied", {"arenas": None, "mmap_threshold": None})
    return fake


def test_each_setting_goes_to_its_glibc_option_in_bytes(fake_mallopt) -> None:
    from agentd.malloc_tuning import M_ARENA_MAX, M_MMAP_THRESHOLD, applied, tune_malloc

    assert (M_ARENA_MAX, M_MMAP_THRESHOLD) == (-8, -3), "glibc's malloc.h numbers"
    assert tune_malloc(2, 128) == {"arenas": 2, "mmap_threshold": 131072}
    assert fake_mallopt.calls == [(-8, 2), (-3, 131072)]
    assert applied() == {"arenas": 2, "mmap_threshold": 131072}
    tune_malloc(1, 1)
    assert fake_mallopt.calls[2:] == [(-8, 1), (-3, 1024)]
    assert applied() == {"arenas": 1, "mmap_threshold": 1024}


def test_zero_leaves_glibc_alone_and_a_refused_setting_is_not_reported(fake_mallopt) -> None:
    from agentd.malloc_tuning import tune_malloc

    assert tune_malloc(0, 0) == {"arenas": None, "mmap_threshold": None}
    assert fake_mallopt.calls == [], "0 is glibc's default: nothing to set"
    fake_mallopt.result = 0   # glibc refuses a value (mallopt answers 0)
    assert tune_malloc(3, 64) == {"arenas": None, "mmap_threshold": None}
    assert fake_mallopt.calls == [(-8, 3), (-3, 65536)]


@pytest.mark.parametrize("arena_env, threshold_env, expected, calls", [
    # a positive number in the environment is what glibc itself took: reported, not set again
    ("1", "65536", {"arenas": 1, "mmap_threshold": 65536}, []),
    (" 3 ", "", {"arenas": 3, "mmap_threshold": 131072}, [(-3, 131072)]),
    # anything else there is not a setting glibc took: the config keys apply
    ("0", "-5", {"arenas": 2, "mmap_threshold": 131072}, [(-8, 2), (-3, 131072)]),
    ("two", "1e5", {"arenas": 2, "mmap_threshold": 131072}, [(-8, 2), (-3, 131072)]),
])
def test_the_environment_wins_over_the_config_keys(fake_mallopt, monkeypatch, arena_env, threshold_env,
                                                   expected, calls) -> None:
    from agentd.malloc_tuning import tune_malloc

    monkeypatch.setenv("MALLOC_ARENA_MAX", arena_env)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", threshold_env)
    assert tune_malloc(2, 128) == expected
    assert fake_mallopt.calls == calls


def test_off_glibc_nothing_is_set_or_reported(fake_mallopt, monkeypatch) -> None:
    from agentd import malloc_tuning

    assert malloc_tuning.tune_malloc(2, 128)["arenas"] == 2
    monkeypatch.setattr(malloc_tuning, "_mallopt", lambda: None)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert malloc_tuning.tune_malloc(2, 128) == {"arenas": None, "mmap_threshold": None}
    assert malloc_tuning.applied() == {"arenas": None, "mmap_threshold": None}


@pytest.mark.parametrize("libc", ["no library", "no mallopt"])
def test_a_libc_without_mallopt_is_off_glibc(monkeypatch, libc) -> None:
    from agentd import malloc_tuning

    class NoMallopt:
        pass

    def cdll(name):  # type: ignore[no-untyped-def]
        assert name is None, "the running process's own symbols, no library search"
        if libc == "no library":
            raise OSError("no such library")
        return NoMallopt()

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert malloc_tuning._mallopt() is None


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_glibcs_mallopt_is_found_in_the_process() -> None:
    from agentd import malloc_tuning

    mallopt = malloc_tuning._mallopt()
    assert mallopt is not None and mallopt.__name__ == "mallopt"


def test_what_is_applied_is_a_copy(fake_mallopt) -> None:
    from agentd.malloc_tuning import applied, tune_malloc

    shown = tune_malloc(2, 0)
    shown["arenas"] = 99
    applied()["mmap_threshold"] = 5
    assert applied() == {"arenas": 2, "mmap_threshold": None}
