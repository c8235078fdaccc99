"""JSON columns whose numbers come back exactly as they were written, on SQLite too.

Pony declares a JSON column's type as `JSON`, which SQLite reads as NUMERIC affinity: a
value written as the text `18446744073709551617` is turned into the REAL 1.8446744073709552e19
(and `1.0` into the INTEGER 1) before it is stored, so a number that is a whole value comes
back rounded. Text SQLite takes for a number is never left as text, so a top-level number is
written as a BLOB of its JSON text, which no affinity converts; everything else is written
as Pony writes it (an object or array is never a number to SQLite). PostgreSQL's `jsonb`
keeps numbers exactly, so there the column is Pony's own.
"""

from __future__ import annotations

import json
from typing import Any

from pony import orm
from pony.orm.dbproviders.sqlite import SQLiteJsonConverter


class ExactJson(orm.Json):
    """The attribute type of a JSON column whose values must read back exactly."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class SqliteExactJsonConverter(SQLiteJsonConverter):
    def val2dbval(self, val: Any, obj: Any = None) -> Any:
        text = super().val2dbval(val, obj)
        return text.encode("utf-8") if _is_number(val) else text

    def dbval2val(self, dbval: Any, obj: Any = None) -> Any:
        # Rows written before this converter hold their numbers as INTEGER/REAL: read as they are.
        if isinstance(dbval, bytes):
            return json.loads(dbval)
        return super().dbval2val(dbval, obj)

    def dbvals_equal(self, x: Any, y: Any) -> bool:
        return super().dbvals_equal(*(json.loads(v) if isinstance(v, bytes) else v for v in (x, y)))


def install(db: Any) -> None:
    """Give `ExactJson` attributes of a freshly bound SQLite `db` the converter above (call
    between `bind` and `generate_mapping`). Pony picks the first converter whose type the
    attribute's type subclasses, so this one goes before `Json`'s."""
    provider = db.provider
    if provider.dialect == "SQLite":
        provider.converter_classes = [(ExactJson, SqliteExactJsonConverter)] + list(provider.converter_classes)
