"""Waitress's HTTP channel, minus the main loop's busy wait on answers being written.

Waitress writes an answer from the worker thread that made it: `write_soon` appends to the
channel's output buffer and sends it at once (`send_bytes` is 1), all under the buffer's
lock. While that lock is held the buffer is not empty, so the main loop, which asks every
channel `writable()` on each turn, registers the socket for writing; a socket with room
is always writable, so `poll` returns at once, the loop finds the lock taken, and turns
again. The worker needs the GIL to finish its send, and the loop keeps taking it: with 32
requests in flight the loop turned about 12 times per request and its thread used 0.2 ms
of CPU per request against the bare Flask proxy's 0.07 (scripts/bench_side_by_side.py,
README "Performance").

A channel here is polled for writing while a request runs only when that request's own
writer could not send everything (a full socket: a slow client, a large answer) and so
left the rest to the loop, as waitress intends. Waitress tells the loop with its trigger,
after the flush; the flag below is set by the flush itself (under the buffer's lock),
before the trigger, so the loop woken by it sees it.
"""

from __future__ import annotations

from waitress.channel import HTTPChannel


class LoopFlushChannel(HTTPChannel):
    """An HTTP channel whose running request's output is left to its writer unless it stalled."""

    # Whether the latest flush left output in the buffer (its writer could not send it all).
    output_left = False

    def writable(self) -> bool:
        if (self.requests and not self.output_left and self.adj.send_bytes <= 1
                and not (self.will_close or self.close_when_flushed)):
            # The request's worker writes and flushes its answer itself (with a larger
            # `send_bytes` waitress leaves small writes for the loop to send: not here).
            return False
        return bool(super().writable())

    def _flush_some(self, do_close: bool = True) -> bool:
        # Every flush ends here, always under the output lock or with no request running:
        # the worker's in write_soon, the loop's, and send_continue's.
        sent = bool(super()._flush_some(do_close=do_close))
        self.output_left = bool(self.total_outbufs_len)
        return sent
