"""agentd/api/json_provider.py: the app's JSON answers are the bytes Flask's own provider
makes, with one encoder kept per set of settings. In process."""

from __future__ import annotations

import datetime
import decimal
import json
import threading
import uuid
from typing import Any

import pytest
from flask import Flask

from agentd.api.json_provider import CachedEncoderProvider

VALUES: list[Any] = [
    {"b": 1, "a": [1.5, None, True, "é \u2028 \"q\""], "nested": {"z": {}, "y": []}},
    {"at": datetime.datetime(2026, 11, 27, 3, 4, 5), "id": uuid.UUID(int=5), "n": decimal.Decimal("1.10")},
    [], "x", None, 3, {"nan": float("nan"), "inf": float("inf")},
]


def _apps(sort_keys: bool, ensure_ascii: bool) -> tuple[Flask, Flask]:
    plain, cached = Flask("plain"), Flask("cached")
    cached.json = CachedEncoderProvider(cached)
    for app in (plain, cached):
        app.json.sort_keys = sort_keys
        app.json.ensure_ascii = ensure_ascii
    return plain, cached


@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_same_bytes_as_flasks_provider(value: Any, sort_keys: bool, ensure_ascii: bool) -> None:
    plain, cached = _apps(sort_keys, ensure_ascii)
    with plain.app_context():
        want = plain.json.response(value)
    with cached.app_context():
        got = cached.json.response(value)
    assert got.get_data() == want.get_data() and got.mimetype == "application/json"
    for kwargs in ({}, {"indent": 2}, {"separators": (",", ":")}, {"sort_keys": not sort_keys},
                   {"allow_nan": False} if "nan" not in str(value) else {"skipkeys": True}):
        assert cached.json.dumps(value, **kwargs) == plain.json.dumps(value, **kwargs)


def test_debug_answers_are_indented_as_flasks() -> None:
    plain, cached = _apps(False, True)
    plain.debug = cached.debug = True
    with plain.app_context():
        want = plain.json.response({"a": [1, 2]}).get_data()
    with cached.app_context():
        assert cached.json.response({"a": [1, 2]}).get_data() == want == b'{\n  "a": [\n    1,\n    2\n  ]\n}\n'


def test_one_encoder_per_set_of_settings() -> None:
    _, cached = _apps(False, True)
    provider = cached.json
    with cached.app_context():
        provider.response({"a": 1})
        (first,) = provider._encoders.values()
        for _ in range(3):
            provider.response({"a": 1})
    (again,) = provider._encoders.values()
    assert again is first  # reused, not made again
    provider.dumps({"a": 1}, indent=2)
    provider.dumps({"a": 1}, separators=(",", ":"))  # the same settings as response()
    assert len(provider._encoders) == 2
    # Every setting it keeps encoders for at once: kept too.
    assert provider.dumps({"a": [1]}, indent=1, separators=(",", ": ")) == '{\n "a": [\n  1\n ]\n}'
    assert len(provider._encoders) == 3
    provider.dumps({"a": 1}, allow_nan=False)  # a setting it does not keep encoders for
    with pytest.raises(ValueError):
        provider.dumps(float("nan"), allow_nan=False)
    assert len(provider._encoders) == 3
    provider.sort_keys = True  # settings changed on the provider get their own encoder
    assert provider.dumps({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    assert len(provider._encoders) == 4


def test_an_unserialisable_value_still_raises() -> None:
    _, cached = _apps(False, True)
    with pytest.raises(TypeError):
        cached.json.dumps({"x": object()})


def test_threads_share_the_encoders() -> None:
    _, cached = _apps(False, True)
    results: list[str] = []

    def work(i: int) -> None:
        for k in range(200):
            results.append(cached.json.dumps({"i": i, "k": k, "v": [i] * (k % 7)}))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    decoded = [json.loads(r) for r in results]
    assert len(decoded) == 1600 and all(d["v"] == [d["i"]] * (d["k"] % 7) for d in decoded)
