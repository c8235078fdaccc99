"""A real Mumble server (Debian `mumble-server`, binary murmurd) for the mumble tests,
in a temp dir on a free port with its self-generated TLS certificate, and
`MumbleUser`: a person on that server, written separately from the adapter straight
from Mumble.proto (Version, Authenticate, ServerSync, UserState, TextMessage)."""

from __future__ import annotations

import os
import select
import socket
import ssl
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any

from fakes.servers import ServerProcess, need
from support import free_port


class Murmur(ServerProcess):
    down_for = 0.3

    def __init__(self, password: str = "") -> None:
        self.binary = need("murmurd")
        # murmurd started as root switches to its own user: the directory must be writable by it.
        self.root = Path(tempfile.mkdtemp(prefix="agentd-murmur-"))
        os.chmod(self.root, 0o777)
        self.port = free_port()
        self.ini = self.root / "murmur.ini"
        self.ini.write_text(f"database={self.root}/murmur.sqlite\nhost=127.0.0.1\nport={self.port}\n"
                            f"logfile={self.root}/murmur.log\npidfile={self.root}/murmur.pid\n"
                            f"serverpassword={password}\nusers=50\nice=\"\"\nbonjour=false\n"
                            "textmessagelength=5000\nwelcometext=\"test server\"\n")

    def start(self) -> "Murmur":
        self.launch([self.binary, "-fg", "-ini", str(self.ini)], self.port)
        return self


def _varint(n: int) -> bytes:
    out = b""
    while n > 0x7F:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def _pb(*fields: tuple[int, Any]) -> bytes:
    out = b""
    for number, value in fields:
        if isinstance(value, int):
            out += _varint(number << 3) + _varint(value)
        else:
            data = value.encode()
            out += _varint((number << 3) | 2) + _varint(len(data)) + data
    return out


def _parse(data: bytes) -> dict[int, list]:
    fields: dict[int, list] = {}
    i = 0
    while i < len(data):
        key = shift = 0
        while True:
            b = data[i]; i += 1; key |= (b & 0x7F) << shift; shift += 7  # noqa: E702
            if b < 0x80:
                break
        kind = key & 7
        if kind == 0:
            value = shift = 0
            while True:
                b = data[i]; i += 1; value |= (b & 0x7F) << shift; shift += 7  # noqa: E702
                if b < 0x80:
                    break
        elif kind == 2:
            size = shift = 0
            while True:
                b = data[i]; i += 1; size |= (b & 0x7F) << shift; shift += 7  # noqa: E702
                if b < 0x80:
                    break
            value, i = data[i:i + size], i + size
        else:
            width = 4 if kind == 5 else 8
            value, i = data[i:i + width], i + width
        fields.setdefault(key >> 3, []).append(value)
    return fields


class MumbleUser:
    """Logs in as `name`; `texts` collects (from name, private?, html text)."""

    def __init__(self, port: int, name: str, password: str = "") -> None:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        self.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10))
        self.name, self.session = name, -1
        self.users: dict[int, str] = {}
        self.texts: list[tuple[str, bool, str]] = []
        self.ended: BaseException | None = None  # why the reader stopped (shown when a test times out)
        self.lock = threading.Lock()
        self.send(0, _pb((1, (1 << 16) | (3 << 8)), (2, "test"), (3, "test"), (4, "")))
        self.send(2, _pb((1, name), (2, password), (5, 1)))
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        if not self.synced.wait(10):
            raise RuntimeError(f"{name} could not log in")

    def send(self, kind: int, body: bytes) -> None:
        with self.lock:
            self.sock.sendall(struct.pack(">HI", kind, len(body)) + body)

    def _exact(self, n: int) -> bytes:
        # OpenSSL must not read and write one connection at once (tell() runs on the test's
        # thread): wait for bytes outside the lock, read under it.
        data = b""
        while len(data) < n:
            if not self.sock.pending():
                select.select([self.sock], [], [])
            with self.lock:
                try:
                    chunk = self.sock.recv(n - len(data))
                except (ssl.SSLWantReadError, socket.timeout):
                    continue
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def _read(self) -> None:
        try:
            while True:
                kind, size = struct.unpack(">HI", self._exact(6))
                fields = _parse(self._exact(size)) if kind in (5, 8, 9, 11) else (self._exact(size) and {})
                if kind == 5:
                    self.session = fields[1][0]
                    self.synced.set()
                elif kind == 8:
                    self.users.pop(fields[1][0], None)
                elif kind == 9 and 3 in fields:
                    self.users[fields[1][0]] = fields[3][0].decode()
                elif kind == 11:
                    sender = self.users.get(fields.get(1, [None])[0], "?")
                    self.texts.append((sender, self.session in fields.get(2, []), fields[5][0].decode()))
        except (OSError, ConnectionError, struct.error) as exc:
            self.ended = exc

    def session_of(self, name: str) -> int:
        return next(s for s, n in self.users.items() if n == name)

    def tell(self, name: str, text: str) -> None:
        self.send(11, _pb((2, self.session_of(name)), (5, text)))

    def say_in_channel(self, text: str, channel: int = 0) -> None:
        self.send(11, _pb((3, channel), (5, text)))

    def from_user(self, name: str, private: bool | None = None) -> list[str]:
        return [t for s, p, t in self.texts if s == name and (private is None or p == private)]

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
