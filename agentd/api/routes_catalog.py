"""Models, providers, usage and budget."""

from __future__ import annotations

from datetime import datetime, timezone

from flask import Blueprint, jsonify, request
from werkzeug.routing import PathConverter
from marshmallow import RAISE, Schema, ValidationError, fields, post_load, validate, validates

from agentd.api import schemas_out as out
from agentd.api.apidoc import doc
from agentd.api.principal import principal, reachable
from agentd.api.schemas import ModelsQuery, PeriodQuery, ProviderKeySchema, ProviderUrlSchema, UsageQuery
from agentd.api import body
from agentd.api.routes_system import kernel
from agentd.schema_fields import StrictBoolean, StrictFloat
from agentd.errors import BadRequest, NotFound
from agentd.metering import MAX_ALERT_LEVELS

bp = Blueprint("catalog", __name__)

TIERS = ("frontier", "smart", "balanced", "fast", "local", "custom")

# `/api/models/custom` (POST) and `/api/models/custom/{id}` (DELETE) manage custom models; a
# model id may hold slashes, so without this GET /api/models/{id} would also answer there
# (and OPTIONS would list GET for those paths). No model can have such an id.
NOT_CUSTOM_ROUTE = r"(?!custom(?:/|$))"


class ModelIdConverter(PathConverter):
    """A model id in a path: slashes allowed, but not the custom-model routes."""

    regex = NOT_CUSTOM_ROUTE + PathConverter.regex


bp.record_once(lambda state: state.app.url_map.converters.setdefault("model_id", ModelIdConverter))


class CustomModelSchema(Schema):
    class Meta:
        unknown = RAISE

    id = fields.String(required=True, validate=[
        validate.Length(min=1, max=200),
        validate.Regexp("^" + NOT_CUSTOM_ROUTE,
                        error="ids `custom` and `custom/...` name the custom-model routes, not a model")])
    # Only `id` and `provider` are needed; what is left out takes these defaults (the name: the id).
    display_name = fields.String(validate=validate.Length(min=1, max=200),
                                 metadata={"description": "Default: the id"})
    provider = fields.String(required=True)
    tier = fields.String(load_default="custom", validate=validate.OneOf(TIERS))
    context_window = fields.Integer(load_default=128_000, strict=True, validate=validate.Range(min=1))
    max_output_tokens = fields.Integer(load_default=8192, strict=True, validate=validate.Range(min=1))
    input_cost_per_m = StrictFloat(load_default=0.0, validate=validate.Range(min=0))
    output_cost_per_m = StrictFloat(load_default=0.0, validate=validate.Range(min=0))
    supports_tools = StrictBoolean(load_default=True)
    supports_vision = StrictBoolean(load_default=False)
    supports_streaming = StrictBoolean(load_default=True)

    @post_load
    def _named(self, data: dict, **_: object) -> dict:
        return {**data, "display_name": data.get("display_name") or data["id"]}

    @validates("provider")
    def _known(self, value: str, **_: object) -> None:
        if kernel().catalog.get_provider(value) is None:
            raise ValidationError(f"unknown provider {value!r}")


class BudgetSchema(Schema):
    class Meta:
        unknown = RAISE

    limit_usd = StrictFloat(required=True, validate=validate.Range(min=0))
    alert_levels = fields.List(
        StrictFloat(validate=validate.Range(min=0, max=1, min_inclusive=False), metadata={"exclusiveMinimum": 0}),
        validate=validate.Length(min=1, max=MAX_ALERT_LEVELS),
        metadata={"description": "Fractions of the limit at which an alert fires (0 < x <= 1; sorted and "
                                 "de-duplicated; left out: unchanged; default [0.8, 1.0])",
                  "example": [0.5, 0.8, 1.0]})


def _iso_arg(name: str) -> datetime | None:
    value = request.args.get(name)
    if value is None or value == "":
        return None
    # RFC 3339 allows a lower-case z, which Python's parser refuses (since 3.11 it takes "Z",
    # a lower-case t and any number of fractional digits).
    try:
        parsed = datetime.fromisoformat(value.upper())
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
@doc("The model catalog (built-in and custom)", tags="models", query=ModelsQuery,
     response={"type": "array", "items": out.ModelSchema})
def models():
    provider = request.args.get("provider") or None
    tier = request.args.get("tier") or None
    return jsonify([m.to_dict() for m in kernel().catalog.models(provider=provider, tier=tier)])


@bp.get("/api/models/aliases")
@doc("Alias -> model id map", tags="models", response={"type": "object", "additionalProperties": {"type": "string"}})
def aliases():
    return jsonify(kernel().catalog.aliases())


@bp.get("/api/models/<model_id:model_id>")
@doc("One model by id or alias", tags="models", response=out.ModelSchema,
     path_params={"model_id": {"pattern": "^" + NOT_CUSTOM_ROUTE}})
def model(model_id: str):
    info = kernel().catalog.get_model(model_id)
    if info is None:
        raise NotFound(f"model not found: {model_id}")
    return jsonify(info.to_dict())


@bp.post("/api/models/custom")
@doc("Add a custom model", tags="models", body=CustomModelSchema, ok=201, response=out.ModelAddedSchema,
     body_example={"id": "my-model", "display_name": "My model", "provider": "openai", "tier": "custom",
                   "context_window": 8192, "max_output_tokens": 1024, "input_cost_per_m": 0.5,
                   "output_cost_per_m": 1.5, "supports_tools": True, "supports_vision": False,
                   "supports_streaming": True},
     errors={409: "A model with this id exists"},
     links={"GetModel": ("catalog.model", {"model_id": "$response.body#/model_id"}),
            "RemoveModel": ("catalog.remove_custom", {"model_id": "$response.body#/model_id"})})
def add_custom():
    data = body.load(CustomModelSchema())
    model_id = kernel().custom_models.add(data)
    return jsonify({"status": "added", "model_id": model_id}), 201


@bp.delete("/api/models/custom/<path:model_id>")
@doc("Remove a custom model", tags="models", response=out.ModelRemovedSchema)
def remove_custom(model_id: str):
    return jsonify({"status": "removed", "model_id": kernel().custom_models.remove(model_id)})


# -- providers ------------------------------------------------------------------------

@bp.get("/api/providers")
@doc("LLM providers and their key status", tags="providers", response={"type": "array", "items": out.ProviderSchema})
def providers():
    return jsonify(kernel().providers.listing())


@bp.post("/api/providers/<name>/key")
@doc("Set a provider's API key (kept in the environment, never in config.toml)", tags="providers",
     body=ProviderKeySchema, response=out.KeySetSchema)
def set_key(name: str):
    kernel().providers.get(name)
    return jsonify(kernel().providers.set_key(name, body.load(ProviderKeySchema())["api_key"]))


@bp.delete("/api/providers/<name>/key")
@doc("Remove a provider's API key", tags="providers", response=out.KeyRemovedSchema)
def delete_key(name: str):
    return jsonify(kernel().providers.delete_key(name))


@bp.put("/api/providers/<name>/url")
@doc("Set a provider's base URL", tags="providers", body=ProviderUrlSchema, response=out.UrlSetSchema)
def set_url(name: str):
    kernel().providers.get(name)
    return jsonify(kernel().providers.set_url(name, body.load(ProviderUrlSchema())["base_url"]))


@bp.post("/api/providers/<name>/test")
@doc("Check a provider's key with a live call", tags="providers", response=out.ProviderTestSchema,
     errors={502: "The provider refused the key or failed", 503: "The provider was unreachable",
             504: "The provider timed out"})
def test_provider(name: str):
    return jsonify(kernel().providers.test(name))


# -- usage and budget ------------------------------------------------------------------

@bp.get("/api/usage")
@doc("Token and cost totals for a period (default: this month)", tags="usage", query=UsageQuery,
     response=out.UsageSchema, errors={404: "No API key has the id or name `key`"})
def usage():
    start, end = _window()
    ref = request.args.get("key")
    if ref is None:
        return jsonify(kernel().metering.totals(start, end))
    key_id = kernel().keys.resolve(ref)
    who = principal()
    if not who.is_admin and key_id != who.key_id:  # a key's spend is its own and the admin's to see
        raise NotFound(f"API key not found: {ref}")
    return jsonify({**kernel().metering.totals(start, end, key_id), "key_id": key_id})


@bp.get("/api/usage/by-model")
@doc("Usage per model for a period", tags="usage", query=PeriodQuery,
     response={"type": "array", "items": out.UsageByModelSchema})
def usage_by_model():
    start, end = _window()
    return jsonify(kernel().metering.by_model(start, end))


@bp.get("/api/budget")
@doc("Monthly budget, spend and alerts", tags="usage", response=out.BudgetStatusSchema)
def budget():
    return jsonify(kernel().metering.budget())


@bp.put("/api/budget")
@doc("Set the monthly budget (0 = no limit)", tags="usage", body=BudgetSchema, response=out.BudgetSetSchema,
     body_example={"limit_usd": 25.0, "alert_levels": [0.5, 0.8, 1.0]})
def set_budget():
    data = body.load(BudgetSchema())
    metering = kernel().metering
    metering.set_limit(data["limit_usd"], data.get("alert_levels"))
    answer = {"status": "updated", "limit_usd": data["limit_usd"]}
    if "alert_levels" in data:  # the spec's answer is {status, limit_usd}; the levels only when set
        answer["alert_levels"] = metering.alert_levels
    return jsonify(answer)


@bp.get("/api/budget/agents")
@doc("Spend per agent this month", tags="usage", response={"type": "array", "items": out.BudgetAgentSchema})
def budget_agents():
    start, end = kernel().metering.period(None, None)
    return jsonify(reachable(kernel().metering.by_agent(start, end)))  # a limited key: its agents' spend
