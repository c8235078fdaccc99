"""POST /v1/embeddings with the `openai` SDK against the real daemon: the local model's vectors
are the memory embedder's, the configured provider's model is called over HTTP, and bad
requests get clear errors."""

from __future__ import annotations

import base64
from typing import Iterator

import numpy as np
import openai
import pytest

from conftest import LLM_ENV, llm_config
from support import Daemon, make_home, stop_shared
from tests.memory.test_semantic import _bag, _Embeddings

from agentd.memory.embedder import LOCAL_MODEL_NAME, LocalEmbedder


@pytest.fixture(scope="module")
def provider() -> Iterator[_Embeddings]:
    server = _Embeddings()
    yield server
    server.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm, provider) -> Iterator[Daemon]:
    extra = (f'mistral = "{provider.url}"\n\n[memory]\nembedding_provider = "mistral"\n'
             'embedding_model = "mistral-embed"\n')
    d = Daemon(make_home(tmp_path_factory.mktemp("embeddings"), llm_config(fake_llm, extra)),
               env_extra={**LLM_ENV, "MISTRAL_API_KEY": "sk-embed"}).start()
    yield d
    stop_shared(d)


@pytest.fixture(scope="module")
def oa(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def local() -> LocalEmbedder:
    return LocalEmbedder()


TEXTS = ["penguins live in antarctica", "volcanoes erupt molten rock"]


def test_local_model_matches_the_memory_embedder(oa, local) -> None:
    # The SDK asks for base64 unless told otherwise, and decodes it.
    answer = oa.embeddings.create(model=LOCAL_MODEL_NAME, input=TEXTS)
    assert answer.object == "list" and answer.model == LOCAL_MODEL_NAME
    assert [(e.object, e.index) for e in answer.data] == [("embedding", 0), ("embedding", 1)]
    got = np.array([e.embedding for e in answer.data], dtype=np.float32)
    assert got.shape == (2, 384)
    assert np.array_equal(got, local.embed(TEXTS))
    # [CLS] + the words' pieces + [SEP], per text.
    tokens = sum(len(local._tokenizer.encode(t).ids) for t in TEXTS)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens


def test_float_format_and_one_string(daemon, local) -> None:
    r = daemon.post("/v1/embeddings", json={"model": LOCAL_MODEL_NAME, "input": "hello world",
                                             "encoding_format": "float", "dimensions": 384})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    vector = np.array(body["data"][0]["embedding"], dtype=np.float32)
    assert np.array_equal(vector, local.embed(["hello world"])[0])
    r = daemon.post("/v1/embeddings", json={"model": LOCAL_MODEL_NAME, "input": "hello world",
                                             "encoding_format": "base64"})
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(raw, vector)


def test_provider_model_over_http(oa, provider) -> None:
    answer = oa.embeddings.create(model="mistral-embed", input=TEXTS, encoding_format="float")
    assert provider.seen[-1]["json"] == {"model": "mistral-embed", "input": TEXTS}
    assert provider.seen[-1]["auth"] == "Bearer sk-embed"
    for item, text in zip(answer.data, TEXTS):
        expected = np.array(_bag(text), dtype=np.float32)
        assert np.allclose(item.embedding, expected / np.linalg.norm(expected))
    assert answer.usage.prompt_tokens == 1  # as the provider counted
    assert oa.embeddings.create(model="mistral/mistral-embed", input="x").model == "mistral/mistral-embed"


@pytest.mark.parametrize("body, status, message", [
    ({"input": [[1, 2, 3]]}, 400, "token arrays are not supported"),
    ({"input": [1, 2, 3]}, 400, "token arrays are not supported"),
    ({"input": []}, 400, "must hold 1 to 2048 strings"),
    ({"input": ["a", ""]}, 400, "must not contain empty strings"),
    ({"input": "a", "dimensions": 128}, 400, "dimensions 128 not supported: all-MiniLM-L6-v2-onnx-int8 gives 384"),
    ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": "a", "model": "text-embedding-3-small"}, 404, "no embedding model 'text-embedding-3-small'"),
])
def test_bad_requests(daemon, body, status, message) -> None:
    r = daemon.post("/v1/embeddings", json={"model": LOCAL_MODEL_NAME, **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"]
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
