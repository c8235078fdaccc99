"""The embedding models clients may call (`POST /v1/embeddings`): the local model agents
recall with, and the configured embedding provider's model when `[memory]` names one.
Each answers with the very embedder memory uses, so a client's vectors match the ones
stored for recall."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from agentd.config.tables import MemoryConfig
from agentd.errors import NotFound
from agentd.memory.embedder import LOCAL_MODEL_NAME

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from agentd.memory.embedder import LocalEmbedder, ProviderEmbedder
    from agentd.memory.service import MemoryService


class EmbeddingModels:
    """Names the models served and embeds texts with one of them."""

    def __init__(self, config: MemoryConfig, memory: "MemoryService") -> None:
        self.config = config
        self.memory = memory
        self._local: LocalEmbedder | None = None
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        """The local model's id, then the provider's model (and its `provider/model` form)."""
        names = [LOCAL_MODEL_NAME]
        if self.config.embedding_provider:
            names += [self.config.embedding_model, f"{self.config.embedding_provider}/{self.config.embedding_model}"]
        return names

    def embed(self, model: str, texts: list[str]) -> tuple["np.ndarray", int]:
        """L2-normalised float32 rows for `texts` and the input tokens counted; 404 for a model
        not served."""
        self._require(model)
        if model == LOCAL_MODEL_NAME:
            return self._local_embedder().embed_counted(texts)
        embedder: ProviderEmbedder = self.memory.embedder  # type: ignore[assignment]
        return embedder.embed_counted(texts)

    def dimensions(self, model: str) -> int | None:
        """The model's vector length (None: a provider's, known after its first answer)."""
        self._require(model)
        if model == LOCAL_MODEL_NAME:
            return self._local_embedder().dimensions
        return self.memory.embedder.dimensions

    def _require(self, model: str) -> None:
        if model not in self.names():
            raise NotFound(f"no embedding model '{model}'; this daemon serves {', '.join(self.names())}",
                           code="model_not_found")

    def _local_embedder(self) -> "LocalEmbedder":
        if not self.config.embedding_provider:
            return self.memory.embedder  # type: ignore[return-value]  # the one recall loads
        if self._local is None:
            with self._lock:
                if self._local is None:
                    from agentd.memory.embedder import LocalEmbedder

                    self._local = LocalEmbedder(self.config.embed_threads)
        return self._local
