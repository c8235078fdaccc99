"""Error shapes: `{"error": msg}` on native routes, OpenAI's object under /v1/.

Every failure, including Flask's own 404/405/413 and unexpected exceptions,
leaves through `error_response`, so a client never sees HTML or a traceback.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException

from agentd.api.response_headers import REQUEST_ID
from agentd.errors import AgentdError
from agentd.store.outage import translate

log = logging.getLogger("agentd.api")

OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    424: "invalid_request_error",
    429: "rate_limit_error",
}
# 503 and 507 keep the default `server_error` type: the server, not the request, failed.

_HTTP_MESSAGES = {
    404: "not found",
    405: "method not allowed",
    413: "request body too large",
}


def is_api_path(path: str) -> bool:
    """JSON routes (/api, /v1, /metrics, the MCP endpoint, A2A's cards and endpoints, the
    channels' webhooks); every other path belongs to the dashboard and gets HTML."""
    return (path.startswith(("/api/", "/v1/", "/a2a/", "/.well-known/"))
            or path in ("/api", "/v1", "/a2a", "/mcp", "/metrics") or is_webhook_path(path))


def is_webhook_path(path: str) -> bool:
    """`/channels/<name>/webhook` and below: a chat platform's requests (routes_webhooks.py)."""
    parts = path.split("/", 4)
    return len(parts) >= 4 and parts[1] == "channels" and parts[3] == "webhook"


def _html_error(status: int, message: str) -> Response:
    """A readable error page for dashboard paths (status kept, no traceback)."""
    from flask import render_template
    from markupsafe import escape

    try:
        # no_session: an error (a refused Host, say) never starts a dashboard session.
        html = render_template("error.html", status=status, message=message, no_session=True)
    except Exception:  # noqa: BLE001 - the error page itself must never fail
        log.exception("error page failed to render")
        html = f"<!doctype html><title>Error {status}</title><h1>Error {status}</h1><p>{escape(message)}</p>"
    return Response(html, status=status, mimetype="text/html")


DEFAULT_RETRY_AFTER = 1.0  # seconds, on a 429 whose cause gave no delay of its own


def retry_after_header(seconds: float | None) -> str:
    """The `Retry-After` value of a refusal: whole seconds, at least 1."""
    return str(max(1, int(-(-(DEFAULT_RETRY_AFTER if seconds is None else seconds) // 1))))


def error_response(status: int, message: str, *, code: str | None = None,
                   retry_after: float | None = None) -> Response:
    """A JSON error in the shape the request's route family expects (HTML off the API)."""
    if status == 429 and retry_after is None:
        # The spec: "`Retry-After` on 429", also when the cause (a provider) named no delay.
        retry_after = DEFAULT_RETRY_AFTER
    if not is_api_path(request.path):
        response = _html_error(status, message)
        if retry_after is not None:
            response.headers["Retry-After"] = retry_after_header(retry_after)
        return response
    if request.path.startswith("/v1/"):
        # The spec's OpenAI error leaves `code` out when there is none (never `null`).
        error = {"message": message, "type": OPENAI_TYPES.get(status, "server_error")}
        if code is not None:
            error["code"] = code
        body = {"error": error}
    else:
        body = {"error": message}
    response = jsonify(body)
    response.status_code = status
    if retry_after is not None:
        response.headers["Retry-After"] = retry_after_header(retry_after)
    return response


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    message = _HTTP_MESSAGES.get(status) or (exc.description or exc.name).rstrip(".")
    if status == 404:
        message = f"not found: {request.method} {request.path}"
        bare = request.path.rstrip("/")
        if bare and bare != request.path and _routed(bare):
            # One URL per resource (the guards compare paths exactly): say which one.
            message += f" (the route is {bare}, without the trailing slash)"
    elif status == 405:
        allowed = exc.valid_methods if hasattr(exc, "valid_methods") else None
        message = f"method {request.method} not allowed on {request.path}"
        response = error_response(405, message)
        if allowed:
            response.headers["Allow"] = ", ".join(sorted(allowed))
        return response
    return error_response(status, message)


def _routed(path: str) -> bool:
    """Whether `path` names a route for this request's method."""
    try:
        current_app.create_url_adapter(request).match(path, request.method)
    except HTTPException:
        return False
    return True


def _agentd_error(exc: AgentdError) -> Response:
    return error_response(exc.status, exc.message, code=getattr(exc, "code", None),
                          retry_after=exc.retry_after)


def _unexpected(exc: Exception) -> Response:
    unavailable = translate(exc)
    if unavailable is not None:
        return _agentd_error(unavailable)
    request_id = request.environ.get(REQUEST_ID, "-")
    log.exception("unhandled error in %s %s (request %s)", request.method, request.path, request_id)
    return error_response(500, f"internal server error (request id {request_id})")


def register_error_handlers(app: Flask) -> None:
    """Install the three handlers: HTTP errors, our own errors, everything else."""
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(AgentdError, _agentd_error)
    app.register_error_handler(Exception, _unexpected)
