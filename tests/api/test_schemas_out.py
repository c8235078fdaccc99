"""agentd/api/schemas_out/base.py: the field helpers the response schemas are built from.
They run at import (class bodies), so the tests call them directly."""

from __future__ import annotations

import pytest
from marshmallow import ValidationError, fields, validate

from agentd.api.schemas_out import base


def test_req_marks_the_same_field_required() -> None:
    field = fields.String()
    assert field.required is False
    assert base.req(field) is field and field.required is True


@pytest.mark.parametrize("helper, cls", [(base.Str, fields.String), (base.Int, fields.Integer),
                                         (base.Num, fields.Float), (base.Bool, fields.Boolean)])
def test_typed_helpers_pass_their_options_on(helper, cls) -> None:
    field = helper(metadata={"description": "what"}, allow_none=True)
    assert type(field) is cls and field.required is True
    assert field.metadata == {"description": "what"} and field.allow_none is True
    plain = helper()
    assert plain.required is True and plain.allow_none is False and plain.metadata == {}


def test_nullable_string() -> None:
    field = base.NullStr()
    assert type(field) is fields.String and field.required is True and field.allow_none is True


def test_status_lists_its_values() -> None:
    field = base.status("queued", "running")
    assert type(field) is fields.String and field.required is True
    assert [type(v) for v in field.validators] == [validate.OneOf]
    assert list(field.validators[0].choices) == ["queued", "running"]


def test_reply_schema() -> None:
    schema_class = base.reply("ModelRemoved", "removed", model_id=base.Str())
    assert schema_class.__name__ == "ModelRemoved" and issubclass(schema_class, base.Out)
    schema = schema_class()
    assert schema.load({"status": "removed", "model_id": "m1", "extra": 1}) == \
        {"status": "removed", "model_id": "m1", "extra": 1}
    with pytest.raises(ValidationError) as info:
        schema.load({"status": "added", "model_id": "m1"})
    assert list(info.value.messages) == ["status"]
    with pytest.raises(ValidationError) as info:
        schema.load({"status": "removed"})
    assert info.value.messages == {"model_id": ["Missing data for required field."]}
    with pytest.raises(ValidationError) as info:
        schema.load({"model_id": "m1"})
    assert info.value.messages == {"status": ["Missing data for required field."]}
