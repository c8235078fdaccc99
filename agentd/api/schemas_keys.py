"""Request bodies of /api/keys (scoped API keys), validated exactly as documented."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, post_load, validate

from agentd.apikeys import SCOPES
from agentd.errors import BadRequest
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.schema_fields import StrictBoolean, StrictFloat, WholeNumber

KEY_NAME = r"^[A-Za-z0-9][A-Za-z0-9 _.@-]{0,63}$"
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def parse_expiry(value: str) -> datetime:
    """An RFC 3339 date-time with its offset (`2030-01-01T00:00:00Z`)."""
    try:
        if not _RFC3339.match(value):
            raise ValueError(value)
        return datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"expires_at is not an ISO 8601 date-time with an offset "
                         f"(2030-01-01T00:00:00Z): {value!r}") from None


def _name(required: bool = False) -> fields.Field:
    return fields.String(required=required, validate=validate.Regexp(
        KEY_NAME, error="must be 1-64 letters, digits, spaces, '_', '.', '@' or '-', starting with a letter "
                        "or digit"),
        metadata={"description": "A unique name (audit records and usage name the key by it)", "pattern": KEY_NAME})


def _no_nul(value: str) -> None:
    if holds_nul(value):
        raise ValidationError(NUL_MESSAGE)


def _scopes(required: bool = False) -> fields.Field:
    return fields.List(fields.String(validate=validate.OneOf(SCOPES)), required=required,
                       validate=validate.Length(min=1),
                       metadata={"description": "What the key may do: read, message, manage, admin"})


class _KeyFields(Schema):
    class Meta:
        unknown = RAISE

    name = _name()
    scopes = _scopes()
    agents = fields.List(fields.String(validate=[validate.Length(min=1, max=200), _no_nul]), allow_none=True,
                         metadata={"description": "Agent ids or name patterns (`support-*`) the key may reach; "
                                                  "empty or absent: every agent"})
    budget_usd_per_day = StrictFloat(allow_none=True, validate=validate.Range(min=0, max=1e9), metadata={
        "description": "Spend allowed per UTC day (null: no daily budget)"})
    budget_usd_per_month = StrictFloat(allow_none=True, validate=validate.Range(min=0, max=1e9), metadata={
        "description": "Spend allowed per UTC calendar month (null: no monthly budget)"})
    rate_limit_per_minute = WholeNumber(allow_none=True, validate=validate.Range(min=1, max=1_000_000),
                                           metadata={"description": "Requests allowed per minute (null: no limit)"})
    expires_at = fields.String(allow_none=True, metadata={"description": "ISO 8601 expiry (null: never)",
                                                          "format": "date-time"})
    enabled = StrictBoolean(metadata={"description": "A disabled key is refused (401) until enabled again"})

    @post_load
    def _expiry(self, data: dict[str, Any], **_: Any) -> dict[str, Any]:
        for field in ("scopes", "agents"):  # a repeated entry grants nothing more: kept once
            if data.get(field):
                data[field] = list(dict.fromkeys(data[field]))
        if data.get("expires_at") is not None:
            try:
                data["expires_at"] = parse_expiry(data["expires_at"])
            except BadRequest as exc:
                raise ValidationError(exc.message, "expires_at") from None
        return data


class KeyCreateSchema(_KeyFields):
    name = _name(required=True)
    scopes = _scopes(required=True)


class KeyUpdateSchema(_KeyFields):
    """Every field optional: only those given change."""
