"""Streaming base: a long-lived HTTP response read line by line (SSE, parsed with
agentd/sse_lines.py, or JSON lines), reopened with backoff when it ends or fails; stop()
breaks the blocking read."""

from __future__ import annotations

from typing import Any, Iterator

import requests

from agentd.channels.adapter import Adapter
from agentd.channels.bases.backoff import Reconnects
from agentd.channels.bases.sender import HttpSender
from agentd.retry import Backoff
from agentd.sse_lines import lines_of


class StreamingAdapter(Adapter):
    """Subclasses implement `open_stream()` and `handle_lines(lines)`."""

    #: seconds without a byte (keepalives included) before the stream counts as dead
    read_timeout = 90.0

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.backoff = Backoff(initial=0.5, maximum=30.0)
        self.healthy = False
        self.state: dict[str, Any] = ctx.load_state()
        self._response: requests.Response | None = None

    def start(self) -> None:
        self.spawn(self._loop, "stream")

    def open_stream(self) -> requests.Response:
        raise NotImplementedError

    def handle_lines(self, lines: Iterator[str]) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        link = Reconnects(self.ctx, self.backoff, "stream failed: %s")
        while not self.stopping.is_set():
            try:
                response = self.open_stream()
                self._response = response
                if response.status_code >= 400:
                    raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")
                self.healthy = True
                link.up()
                # As iter_lines reads (512 bytes at most per read), but lines end only at \n
                # or \r\n (not at U+2028 inside a JSON string) and are always UTF-8, as SSE is.
                self.handle_lines(lines_of(response.iter_content(chunk_size=512)))
                raise RuntimeError("stream ended")
            except Exception as exc:  # noqa: BLE001
                self.healthy = False
                if self.stopping.is_set():
                    break
                link.down(exc)
                self.backoff.wait(self.stopping)
            finally:
                self._response = None

    def stream(self, url: str, **kwargs: Any) -> requests.Response:
        """GET `url` as a stream with this base's read timeout."""
        return self.http.session.get(url, stream=True, timeout=(10, self.read_timeout), **kwargs)

    def close(self) -> None:
        self.http.close()  # shuts the stream's socket down: the blocked read ends at once

    def health(self) -> bool:
        return self.healthy

    def save_cursor(self, **values: Any) -> None:
        self.state.update(values)
        self.ctx.save_state(dict(self.state))

