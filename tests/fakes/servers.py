"""Start real servers for channel tests in a temp dir on a free port: ngircd (IRC),
dovecot (IMAP) and aiosmtpd (SMTP into the Maildir dovecot serves)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from support import free_port


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def need(binary: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if os.path.exists(f"/usr/sbin/{binary}") else None)
    if path is None:
        pytest.skip(f"{binary} is not installed (Debian package listed in .ci/apt-packages)")
    return path


class Ngircd:
    """A real ngircd on 127.0.0.1:<free port>; restart() keeps the port."""

    def __init__(self, root: Path) -> None:
        self.binary = need("ngircd")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        self.port = free_port()
        (root / "motd").write_text("welcome\n")
        (root / "ngircd.conf").write_text(
            "[Global]\nName = irc.test\nInfo = test server\nListen = 127.0.0.1\n"
            f"Ports = {self.port}\nMotdFile = {root / 'motd'}\nPidFile = {root / 'ngircd.pid'}\n"
            "[Limits]\nMaxConnectionsIP = 0\nPingTimeout = 120\nPongTimeout = 20\n"
            "[Options]\nPAM = no\nIdent = no\nDNS = no\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Ngircd":
        self.proc = subprocess.Popen([self.binary, "-n", "-f", str(self.root / "ngircd.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()


class IrcUser:
    """A plain IRC client in the test (the platform user)."""

    def __init__(self, port: int, nick: str) -> None:
        self.nick = nick
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""
        self.lines: list[str] = []
        self.send(f"NICK {nick}")
        self.send(f"USER {nick} 0 * :test user")
        self.wait(lambda line: " 001 " in line)

    def send(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\r\n")

    def wait(self, match, timeout: float = 10.0) -> str:  # type: ignore[no-untyped-def]
        """Read lines (answering PING) until `match(line)`; return that line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\n" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\n", 1)
                line = raw.rstrip(b"\r").decode("utf-8", "replace")
                self.lines.append(line)
                if line.startswith("PING"):
                    self.send("PONG" + line[4:])
                elif match(line):
                    return line
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buffer += chunk
        raise AssertionError(f"{self.nick}: no matching line within {timeout}s; got {self.lines[-10:]}")

    def close(self) -> None:
        try:
            self.send("QUIT :bye")
        except OSError:
            pass
        self.sock.close()
