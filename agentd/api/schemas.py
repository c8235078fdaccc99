"""marshmallow schemas for request bodies (strict types, clear messages)."""

from __future__ import annotations

from marshmallow import RAISE, Schema, fields


class _Body(Schema):
    class Meta:
        unknown = RAISE


class SpawnSchema(_Body):
    manifest_toml = fields.String(load_default=None, allow_none=True)
    signed_manifest = fields.String(load_default=None, allow_none=True)


class AttachmentSchema(Schema):
    file_id = fields.String(required=True)
    filename = fields.String(load_default="")
    content_type = fields.String(load_default="")


class MessageSchema(Schema):
    # Unknown keys (sender_id, ...) are ignored: clients of other runtimes send them.
    class Meta:
        unknown = "exclude"

    message = fields.String(required=True)
    attachments = fields.List(fields.Nested(AttachmentSchema), load_default=list)


# Shared instances: a schema may load many bodies concurrently, and building one per
# request (fields are deep-copied) is a measurable part of a message's cost.
MESSAGE_SCHEMA = MessageSchema()


class ModeSchema(_Body):
    mode = fields.String(required=True)
