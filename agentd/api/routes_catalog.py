"""Models, providers, usage and budget."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import Blueprint, jsonify, request
from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates

from agentd.api import body
from agentd.api.routes_system import kernel
from agentd.schema_fields import StrictFloat
from agentd.errors import BadRequest, NotFound

bp = Blueprint("catalog", __name__)

TIERS = ("frontier", "smart", "balanced", "fast", "local", "custom")


class CustomModelSchema(Schema):
    class Meta:
        unknown = RAISE

    id = fields.String(required=True, validate=validate.Length(min=1, max=200))
    display_name = fields.String(required=True, validate=validate.Length(min=1, max=200))
    provider = fields.String(required=True)
    tier = fields.String(load_default="custom", validate=validate.OneOf(TIERS))
    context_window = fields.Integer(required=True, strict=True, validate=validate.Range(min=1))
    max_output_tokens = fields.Integer(required=True, strict=True, validate=validate.Range(min=1))
    input_cost_per_m = StrictFloat(required=True, validate=validate.Range(min=0))
    output_cost_per_m = StrictFloat(required=True, validate=validate.Range(min=0))
    supports_tools = fields.Boolean(required=True, truthy={True}, falsy={False})
    supports_vision = fields.Boolean(required=True, truthy={True}, falsy={False})
    supports_streaming = fields.Boolean(required=True, truthy={True}, falsy={False})

    @validates("provider")
    def _known(self, value: str, **_: object) -> None:
        if kernel().catalog.get_provider(value) is None:
            raise ValidationError(f"unknown provider {value!r}")


class BudgetSchema(Schema):
    class Meta:
        unknown = RAISE

    limit_usd = StrictFloat(required=True, validate=validate.Range(min=0))


def _iso_arg(name: str) -> datetime | None:
    value = request.args.get(name)
    if value is None or value == "":
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"'{name}' must be an ISO 8601 date or time, got {value!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _window() -> tuple[datetime, datetime]:
    since, until = _iso_arg("since"), _iso_arg("until")
    if since and until and since >= until:
        raise BadRequest("'since' must be before 'until'")
    return kernel().metering.period(since, until)


# -- models -------------------------------------------------------------------------

@bp.get("/api/models")
def models():
    provider = request.args.get("provider") or None
    tier = request.args.get("tier") or None
    return jsonify([m.to_dict() for m in kernel().catalog.models(provider=provider, tier=tier)])


@bp.get("/api/models/aliases")
def aliases():
    return jsonify(kernel().catalog.aliases())


@bp.get("/api/models/<path:model_id>")
def model(model_id: str):
    info = kernel().catalog.get_model(model_id)
    if info is None:
        raise NotFound(f"model not found: {model_id}")
    return jsonify(info.to_dict())


@bp.post("/api/models/custom")
def add_custom():
    data = body.load(CustomModelSchema())
    model_id = kernel().custom_models.add(data)
    return jsonify({"status": "added", "model_id": model_id}), 201


@bp.delete("/api/models/custom/<path:model_id>")
def remove_custom(model_id: str):
    kernel().custom_models.remove(model_id)
    return jsonify({"status": "removed", "model_id": model_id})


# -- providers ------------------------------------------------------------------------

@bp.get("/api/providers")
def providers():
    return jsonify(kernel().providers.listing())


def _field(name: str) -> object:
    data = body.json_body()
    if not isinstance(data, dict) or name not in data:
        raise BadRequest(f"request body must be a JSON object with '{name}'")
    return data[name]


@bp.post("/api/providers/<name>/key")
def set_key(name: str):
    kernel().providers.get(name)
    return jsonify(kernel().providers.set_key(name, _field("api_key")))


@bp.delete("/api/providers/<name>/key")
def delete_key(name: str):
    return jsonify(kernel().providers.delete_key(name))


@bp.put("/api/providers/<name>/url")
def set_url(name: str):
    kernel().providers.get(name)
    return jsonify(kernel().providers.set_url(name, _field("base_url")))


@bp.post("/api/providers/<name>/test")
def test_provider(name: str):
    return jsonify(kernel().providers.test(name))


# -- usage and budget ------------------------------------------------------------------

@bp.get("/api/usage")
def usage():
    start, end = _window()
    return jsonify(kernel().metering.totals(start, end))


@bp.get("/api/usage/by-model")
def usage_by_model():
    start, end = _window()
    return jsonify(kernel().metering.by_model(start, end))


@bp.get("/api/budget")
def budget():
    return jsonify(kernel().metering.budget())


@bp.put("/api/budget")
def set_budget():
    data = body.load(BudgetSchema())
    kernel().metering.set_limit(data["limit_usd"])
    return jsonify({"status": "updated", "limit_usd": data["limit_usd"]})


@bp.get("/api/budget/agents")
def budget_agents():
    start, end = kernel().metering.period(None, None)
    return jsonify(kernel().metering.by_agent(start, end))
