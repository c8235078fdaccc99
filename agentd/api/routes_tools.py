"""The built-in tools this daemon offers agents, and whether each can work here."""

from __future__ import annotations

from flask import Blueprint, jsonify
from marshmallow import fields

from agentd.api.apidoc import doc
from agentd.api.routes_system import kernel
from agentd.api.schemas_out.base import Bool, NullStr, Out, Str, req

bp = Blueprint("tools", __name__)


class ToolInfoSchema(Out):
    name = Str()
    family = Str(metadata={"example": "browser"})
    description = Str()
    parameters = req(fields.Dict(metadata={"description": "JSON schema of the arguments, as offered to models"}))
    read_only = Bool(metadata={"description": "Offered in Observe mode (no side effects)"})
    capability = NullStr()
    available = Bool()
    reason = NullStr()


@bp.get("/api/tools")
@doc("Every built-in tool: family, argument schema, gates, and whether it can work in this daemon",
     tags="tools", response={"type": "array", "items": ToolInfoSchema})
def tools():
    return jsonify(kernel().tool_services.listing())
