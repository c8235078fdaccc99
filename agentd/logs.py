"""The daemon's log lines: readable text (the default) or one JSON object per line.

A log line names the request, agent and run it was written for. They live in a context
variable: the HTTP layer binds the request id, the run binds the agent (and its run id)
on whichever thread it executes, and a run's tool calls carry the run's context to
their threads.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, NamedTuple

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class LogContext(NamedTuple):
    request_id: str | None = None
    agent: str | None = None
    run_id: str | None = None


_NONE = LogContext()
_context: contextvars.ContextVar[LogContext] = contextvars.ContextVar("agentd_log_context", default=_NONE)


def current() -> LogContext:
    """The request, agent and run the current code works for (None where unknown)."""
    return _context.get()


def request_id() -> str | None:
    return _context.get().request_id


def bind(**fields: str | None) -> contextvars.Token:
    """Name the request, agent or run for the lines that follow; `unbind(token)` ends it."""
    current = _context.get()
    get = fields.get
    # (Built directly: namedtuple's `_replace` is two Python calls, and every request binds thrice.)
    return _context.set(LogContext(get("request_id", current.request_id), get("agent", current.agent),
                                   get("run_id", current.run_id)))


def unbind(token: contextvars.Token) -> None:
    _context.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, request_id, agent, run_id
    (null when unknown), and `exception` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        ctx = _context.get()
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": ctx.request_id,
            "agent": ctx.agent,
            "run_id": ctx.run_id,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def setup_logging(level: str, fmt: str = "text") -> None:
    """Log to stderr at `level`, one line per record in `fmt` (text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler], force=True)
    # Warnings become records too, so a JSON log never holds a line that is not JSON.
    logging.captureWarnings(fmt == "json")
    # waitress's per-queue warnings are noise for a daemon sized for streams.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)
    # urllib3's debug lines carry whole request paths, where some platforms put the bot's
    # token (Telegram's /bot<token>/...): the daemon's own lines name calls without it.
    logging.getLogger("urllib3").setLevel(logging.INFO)
