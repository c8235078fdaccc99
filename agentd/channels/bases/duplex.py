"""One socket (plain or TLS) shared by a reader thread and writer threads.

OpenSSL forbids SSL_read and SSL_write on one connection at the same time, and CPython's
ssl module does not serialise them: a send from one thread while another sits in recv()
can corrupt the TLS state, and the connection then fails with a bad record MAC or a
reader that never wakes (python/cpython#151508, openssl/openssl#20446). So the reader
waits for bytes outside the lock (poll) and only reads under it; writers write under it.
A plain TCP socket goes through the same path at the cost of one select per read.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading

# A record whose first bytes arrived is read under the lock; this bounds how long a server
# that stalls mid-record can hold writers up (the read is retried afterwards).
RECORD_WAIT_SECS = 5.0


class DuplexSocket:
    """`recv()` for the one reader thread, `sendall()` for any number of writers."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        sock.settimeout(RECORD_WAIT_SECS)

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes; b"" once the peer closed (or `shutdown()` was called)."""
        while True:
            if not self._buffered():
                self._wait_readable()
            with self._lock:
                try:
                    return self.sock.recv(size)
                except (ssl.SSLWantReadError, socket.timeout):
                    continue  # readable, but not a whole record yet: let writers in, wait again

    def sendall(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def _wait_readable(self) -> None:
        """Block until data, EOF or `shutdown()` (poll: no FD_SETSIZE limit as with select)."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLPRI)
        poller.poll()

    def _buffered(self) -> bool:
        """Decrypted bytes already inside the TLS layer, which select() cannot see."""
        return isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0

    def shutdown(self) -> None:
        """Wake the reader (its select returns, recv gives b"") without taking the lock."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.shutdown()
        self.sock.close()
