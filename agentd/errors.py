"""Exceptions shared by every layer.

Each carries the HTTP status the API should answer with, so routes stay thin:
the kernel raises, one error handler shapes the response.
"""

from __future__ import annotations


class AgentdError(Exception):
    """Base class: a failure with a message meant for the client."""

    status = 500

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.retry_after = retry_after
        # Machine-readable code for the OpenAI-style error shape (e.g. model_not_found).
        self.code = code


class BadRequest(AgentdError):
    status = 400


class Unauthorized(AgentdError):
    status = 401


class Forbidden(AgentdError):
    status = 403


class NotFound(AgentdError):
    status = 404


class Conflict(AgentdError):
    status = 409


class PayloadTooLarge(AgentdError):
    status = 413


class TooManyRequests(AgentdError):
    status = 429


class ConfigError(AgentdError):
    """The config file cannot be used; the daemon must not start."""
