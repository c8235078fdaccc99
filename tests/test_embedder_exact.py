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
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen.append({"path": self.path, "headers": dict(self.headers), "json": body})
                if outer.script:
                    status, payload, headers = outer.script.pop(0)
                else:
                    rows = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0, 0.0]}
                            for i, t in enumerate(body["input"])]
                    status, payload, headers = 200, {"object": "list", "data": rows[::-1]}, {}
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
    assert local._threads == min(2, os.cpu_count() or 1) and LocalEmbedder(3)._threads == 3
    assert LocalEmbedder(-1)._threads == min(2, os.cpu_count() or 1)
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
