"""Reading Server-Sent Events (a provider's streamed answer, a platform's event stream):
bytes into lines, lines into events. Only the standard library: any layer may use it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One event: its `event:` name ("" when it has none) and its `data:` lines joined by \\n."""

    event: str
    data: str


class SseParser:
    """Fields of an SSE stream, one line at a time (without its line ending). Comments
    (`:`...) and fields other than `event` and `data` are skipped; one space after the
    colon is not part of the value; a blank line ends an event, which is only given
    when it had a `data` line."""

    __slots__ = ("_event", "_data")

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        """The event this line ends, if it ends one."""
        if not line:
            return self.end()
        if line[0] == ":":
            return None
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def end(self) -> SseEvent | None:
        """The event under way, if it has data (a stream may end without its blank line)."""
        found = SseEvent(self._event, "\n".join(self._data)) if self._data else None
        self._event, self._data = "", []
        return found


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    """The UTF-8 lines of a body read in chunks of any size, ended by \\n or \\r\\n; a last
    line without an ending is given too. Bytes that are not UTF-8 become U+FFFD."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        start = 0
        while True:
            nl = buffer.find(b"\n", start)
            if nl < 0:
                break
            yield buffer[start:nl].rstrip(b"\r").decode("utf-8", errors="replace")
            start = nl + 1
        buffer = buffer[start:]
    if buffer:
        yield buffer.rstrip(b"\r").decode("utf-8", errors="replace")


def sse_events(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of an SSE stream's lines, the last one even without its blank line."""
    parser = SseParser()
    for line in lines:
        event = parser.feed(line)
        if event is not None:
            yield event
    event = parser.end()
    if event is not None:
        yield event
