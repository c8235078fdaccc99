"""Request and response shapes of /api/skills (agentd/api/routes_skills.py)."""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from agentd.schema_fields import NOT_BLANK


class SkillInstallSchema(Schema):
    class Meta:
        unknown = RAISE

    path = fields.String(validate=validate.Regexp(NOT_BLANK, error="must not be empty"), metadata={
        "description": "Absolute path of a skill folder (with SKILL.md) on the daemon's machine"})
    url = fields.String(validate=validate.Regexp(NOT_BLANK, error="must not be empty"), metadata={
        "description": "http(s) URL of a zip archive; its host must be in [tools] fetch_allow_hosts"})

    @validates_schema
    def _one_source(self, data: dict[str, Any], **_: Any) -> None:
        if ("path" in data) == ("url" in data):
            raise ValidationError("give exactly one of path and url (or upload a zip as multipart 'file')")


SKILL = {
    "type": "object",
    "required": ["name", "description", "path", "files", "valid", "errors"],
    "properties": {
        "name": {"type": "string", "description": "From the front matter (the folder's name when invalid)"},
        "description": {"type": "string"},
        "path": {"type": "string", "description": "The skill's folder on the daemon's machine"},
        "files": {"type": "array", "items": {"type": "string"}, "description": "Files, relative to the folder"},
        "valid": {"type": "boolean"},
        "errors": {"type": "array", "items": {"type": "string"}, "description": "Why the skill is not valid"},
    },
}
SKILL_LIST = {"type": "array", "items": SKILL}
SKILL_DELETED = {"type": "object", "required": ["status", "name"],
                 "properties": {"status": {"type": "string", "enum": ["removed"]}, "name": {"type": "string"}}}
