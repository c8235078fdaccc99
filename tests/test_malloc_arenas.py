"""The glibc malloc arena cap: `[api] malloc_arenas` reaches glibc, and the daemon says which
cap is in effect in GET /api/health/detail, beside how full its bounded caches are."""

from __future__ import annotations

import ctypes
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
    from agentd.malloc_arenas import cap_arenas
    print(cap_arenas(int(sys.argv[1])))
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


def arenas_after_threads(cap: int, env: dict[str, str] | None = None) -> tuple[str, int]:
    import os

    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", COUNT_ARENAS, str(cap)], capture_output=True, text=True,
                         check=True, timeout=60, env={**environ, **(env or {})}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_cap_limits_the_heaps_glibc_makes() -> None:
    assert arenas_after_threads(1) == ("1", 1)
    assert arenas_after_threads(2) == ("2", 2)
    reported, uncapped = arenas_after_threads(0)
    assert reported == "None" and uncapped > 2, "eight allocating threads get arenas of their own"
    # MALLOC_ARENA_MAX, read by glibc itself, wins over the config key and is what is reported.
    assert arenas_after_threads(2, {"MALLOC_ARENA_MAX": "1"}) == ("1", 1)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_daemon_applies_the_configured_cap_and_reports_its_caches(tmp_path: Path, fake_llm) -> None:
    config = (FAST_API + "malloc_arenas = 1\n" + llm_config(fake_llm)[len(FAST_API):]
              + "\n[agents]\ncached_sessions = 2\n[memory]\nindex_cache_fragments = 500\n")
    configured = Daemon(make_home(tmp_path / "one", config), env_extra=LLM_ENV).start()
    default = Daemon(make_home(tmp_path / "default")).start()
    try:
        assert default.get("/api/health/detail").json()["malloc_arenas"] == 2
        health = configured.get("/api/health/detail").json()
        assert health["malloc_arenas"] == 1
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


def test_a_bad_cap_is_refused_at_start(tmp_path: Path) -> None:
    from agentd.config import ConfigError, load_config

    home = make_home(tmp_path, "[api]\nmalloc_arenas = 100\n")
    with pytest.raises(ConfigError, match="api.malloc_arenas: must be between 0 and 64"):
        load_config(home)
