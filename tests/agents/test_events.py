"""Run events in process: the fan-out to sinks and the queue a transport reads from.

SSE, WebSocket and the OpenAI stream read these through the daemon (tests/api/test_transports.py,
tests/api/test_ws_daemon.py); here order, dropping a broken sink and end of stream are exact.
"""

from __future__ import annotations

import logging

import pytest

from agentd.agents.events import Event, Fanout


def test_event_defaults_and_is_frozen() -> None:
    a, b = Event("done"), Event("done")
    assert a.data == {} and a == b
    a.data["x"] = 1
    assert b.data == {}, "BUG: events share one default data dict"
    with pytest.raises(AttributeError):
        a.type = "error"  # type: ignore[misc]


def test_fanout_delivers_in_order_to_every_sink() -> None:
    got: list[tuple[str, str]] = []
    first = lambda e: got.append(("first", e.type))  # noqa: E731
    second = lambda e: got.append(("second", e.type))  # noqa: E731
    initial = [first]
    fan = Fanout(initial)
    initial.append(second)   # the fan-out keeps its own list
    fan(Event("text_delta"))
    assert got == [("first", "text_delta")], "BUG: Fanout must copy the sinks it is given"
    fan.add(second)
    fan(Event("done", {"response": "r"}))
    assert got[1:] == [("first", "done"), ("second", "done")]
    fan.remove(first)
    fan.remove(first)   # removing an absent sink is harmless
    fan(Event("error"))
    assert got[3:] == [("second", "error")]
    Fanout()(Event("done"))   # no sinks: nothing to do
    Fanout(None).add(second)


def test_a_failing_sink_is_dropped_and_the_others_still_get_the_event(caplog) -> None:
    got: list[str] = []
    calls: list[int] = []

    def broken(event: Event) -> None:
        calls.append(1)
        raise OSError("client gone")

    fan = Fanout([broken, lambda e: got.append(e.type)])
    with caplog.at_level(logging.WARNING, logger="agentd.events"):
        fan(Event("phase"))
    fan(Event("done"))
    assert got == ["phase", "done"] and calls == [1], "BUG: a failing sink must be dropped after its first failure"
    records = [r for r in caplog.records if r.name == "agentd.events"]
    assert [(r.levelname, r.getMessage()) for r in records] == [("WARNING", "event sink failed; dropping it")]
    assert records[0].exc_info and records[0].exc_info[0] is OSError


def test_a_sink_may_remove_itself_while_events_are_delivered() -> None:
    got: list[str] = []
    fan = Fanout()

    def once(event: Event) -> None:
        got.append("once:" + event.type)
        fan.remove(once)

    fan.add(once)
    fan.add(lambda e: got.append("always:" + e.type))
    fan(Event("a"))
    fan(Event("b"))
    assert got == ["once:a", "always:a", "always:b"]


