"""POST /v1/embeddings: the embedding model agents recall with, for clients."""

from __future__ import annotations

import base64

from flask import Blueprint, jsonify

from agentd.api import body
from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.routes_system import kernel
from agentd.api.schemas_openai import EMBEDDINGS_REQUEST_SCHEMA, EmbeddingsRequestSchema
from agentd.errors import BadRequest

bp = Blueprint("embeddings", __name__)


@bp.post("/v1/embeddings")
@doc("Embed texts with the model agents recall with", tags="openai", body=EmbeddingsRequestSchema,
     response=out.EmbeddingListSchema, body_example={"model": "all-MiniLM-L6-v2-onnx-int8", "input": "hello"},
     description="`model` is the local embedding model (`all-MiniLM-L6-v2-onnx-int8`, 384 dimensions), or, "
                 "when `[memory] embedding_provider` is set, its `embedding_model` (also as "
                 "`provider/model`), called over HTTP. `input` is a string or an array of strings; token "
                 "arrays are refused with 400. Vectors are L2-normalised, as memory stores them. "
                 "`encoding_format: base64` gives little-endian float32 bytes. `dimensions` must equal "
                 "the model's own (no shortening).",
     errors={404: "No such embedding model (`model_not_found`)",
             502: "The embedding model failed (not installed, or the provider failed)"})
def create_embeddings():
    data = body.validate(EMBEDDINGS_REQUEST_SCHEMA, body.json_body())
    models = kernel().embeddings
    model, texts, wanted = data["model"], data["input"], data.get("dimensions")
    if wanted is not None and models.dimensions(model) not in (None, wanted):
        raise BadRequest(f"dimensions {wanted} not supported: {model} gives {models.dimensions(model)} "
                         "dimensions and agentd does not shorten vectors", code="unsupported_dimensions")
    matrix, tokens = models.embed(model, texts)
    if wanted is not None and matrix.shape[1] != wanted:
        raise BadRequest(f"dimensions {wanted} not supported: {model} gives {matrix.shape[1]} dimensions "
                         "and agentd does not shorten vectors", code="unsupported_dimensions")
    as_base64 = data.get("encoding_format") == "base64"
    rows = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") if as_base64 else row.tolist()
            for row in matrix]
    return jsonify({"object": "list", "model": model,
                    "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
