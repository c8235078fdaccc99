"""The per-route registry the OpenAPI document is built from.

Every API view carries an `Operation` set by the `@doc(...)` decorator, placed
right under its `@bp.get/post/...` line:

    @bp.post("/api/agents")
    @doc("Spawn an agent", body=SpawnSchema, ok=201, response=SpawnedSchema,
         errors={403: "signature verification failed"})
    def spawn(): ...

Request bodies name the same marshmallow classes the view validates with
(`body.load(SpawnSchema())`), so the document cannot drift from the checks.
Statuses every route can answer (400 host/validation, 401 auth, 403 cross-site,
404 unknown resource, 413/415 bodies, 429 rate limit, 500) are added by the
builder (agentd/api/openapi.py); `errors` lists the route's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from marshmallow import Schema

from agentd.a2a.card import CARD_PATH, LEGACY_CARD_PATH

F = TypeVar("F", bound=Callable[..., Any])

# A body or response schema: a marshmallow class or instance, or a raw JSON schema dict.
SchemaLike = type[Schema] | Schema | dict[str, Any]


@dataclass
class Operation:
    """What the document says about one route (one view function)."""

    summary: str
    description: str = ""
    tags: tuple[str, ...] = ()
    body: SchemaLike | None = None
    body_required: bool = True
    body_media: str = "application/json"
    body_example: Any = None
    query: type[Schema] | None = None
    path_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    ok: int = 200
    response: SchemaLike | None = None
    response_media: str = "application/json"
    # The 2xx answer may also be an SSE stream (the request's `stream: true`); a schema here
    # names its events (the generic SSE event otherwise).
    sse_alt: bool | dict[str, Any] = False
    ok_description: str = ""
    ok_headers: tuple[str, ...] = ()
    errors: dict[int, str] = field(default_factory=dict)
    # link name -> (target operationId, {target parameter: runtime expression}[, request body
    # with runtime expressions inside])
    links: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    public: bool = False
    websocket: bool = False
    # Answers besides `ok` and the common errors, or in place of a common error's body:
    # status -> (description, JSON body schema, or None for an empty body).
    replies: dict[int, tuple[str, Any]] = field(default_factory=dict)
    # False: the body is read as JSON whatever its Content-Type (no 415).
    checks_media: bool = True


def doc(summary: str, **details: Any) -> Callable[[F], F]:
    """Attach an `Operation` to a view; see the module docstring."""
    if "tags" in details and isinstance(details["tags"], str):
        details["tags"] = (details["tags"],)
    op = Operation(summary, **details)

    def mark(view: F) -> F:
        view.__apidoc__ = op  # type: ignore[attr-defined]
        return view

    return mark


def operation_of(view: Callable[..., Any]) -> Operation | None:
    """The `Operation` a view was documented with, if any."""
    return getattr(view, "__apidoc__", None)


def is_api_path(rule: str) -> bool:
    """Routes under /api/ and /v1/, /metrics, the MCP endpoint and A2A's cards and endpoints
    are the API; everything else (dashboard pages, /static, the /api HTML page, the chat
    platforms' webhooks) is not part of the document."""
    return (rule.startswith(("/api/", "/v1/", "/a2a/")) or rule in ("/metrics", "/mcp", "/a2a")
            or rule in (CARD_PATH, LEGACY_CARD_PATH))
