"""Response shapes of /api/keys."""

from __future__ import annotations

from marshmallow import fields

from agentd.api.schemas_out.base import Bool, NullStr, Num, Out, Str, req

__all__ = ["ApiKeySchema", "ApiKeyCreatedSchema", "KeyDeletedSchema"]


class ApiKeySchema(Out):
    id = Str()
    name = Str()
    scopes = req(fields.List(fields.String()))
    agents = req(fields.List(fields.String()))
    budget_usd_per_day = req(fields.Float(allow_none=True))
    budget_usd_per_month = req(fields.Float(allow_none=True))
    rate_limit_per_minute = req(fields.Integer(allow_none=True))
    expires_at = NullStr()
    enabled = Bool()
    created_at = Str()
    updated_at = Str()
    last_used_at = NullStr()
    spent_usd_today = Num()
    spent_usd_this_month = Num()


class ApiKeyCreatedSchema(ApiKeySchema):
    key = Str(metadata={"description": "The secret (`agd_...`), shown only in this answer"})


class KeyDeletedSchema(Out):
    status = Str()
    id = Str()
