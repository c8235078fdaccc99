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


def wait_port(port: int, timeout: float = 30.0, proc: "subprocess.Popen | None" = None) -> None:
    """Wait until 127.0.0.1:`port` accepts connections. Generous: a server starting TLS
    (ngircd prepares its DH parameters) takes seconds on a loaded 2-core machine. Fails
    at once when `proc` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def need(binary: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if os.path.exists(f"/usr/sbin/{binary}") else None)
    if path is None:
        pytest.skip(f"{binary} is not installed (Debian package listed in .ci/apt-packages)")
    return path


def end(proc: "subprocess.Popen | None") -> None:
    """Terminate a server process still running; kill it if it has not gone in 5 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class ServerProcess:
    """A real server binary run in the foreground for a test (ngircd, murmur, prosody):
    `launch()` starts it and waits for its ports; stop() terminates it (kills it after 5 s)."""

    proc: "subprocess.Popen | None" = None
    root: Path
    #: seconds between stop() and start() in restart(): the port is free again by then
    down_for = 0.0

    def start(self) -> "ServerProcess":
        raise NotImplementedError

    def launch(self, argv: list[str], *ports: int, timeout: float = 30.0) -> None:
        """Run `argv` (output discarded) and wait until every port in `ports` accepts connections."""
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for port in ports:
                wait_port(port, timeout=timeout, proc=self.proc)
        except RuntimeError:
            self.stop()  # the test never gets the object to stop: do not leave the server behind
            raise

    def stop(self) -> None:
        end(self.proc)

    def restart(self) -> None:
        """Stop, wait `down_for`, start again on the same port(s)."""
        self.stop()
        if self.down_for:
            time.sleep(self.down_for)
        self.start()

    def cleanup(self) -> None:
        """Stop, and remove the server's directory `root`."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class Ngircd(ServerProcess):
    """A real ngircd on 127.0.0.1:<free port>; restart() keeps the port."""

    def __init__(self, root: Path, tls: bool = False) -> None:
        self.binary = need("ngircd")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        self.port = free_port()
        (root / "motd").write_text("welcome\n")
        ssl_section = ""
        if tls:  # a self-signed certificate; the server also listens with TLS on tls_port
            openssl = shutil.which("openssl") or pytest.skip("openssl is not installed")
            subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                            "-subj", "/CN=127.0.0.1", "-keyout", str(root / "key.pem"),
                            "-out", str(root / "cert.pem")], check=True, capture_output=True)
            for name in ("key.pem", "cert.pem"):
                os.chmod(root / name, 0o644)
            self.tls_port = free_port()
            ssl_section = (f"[SSL]\nCertFile = {root / 'cert.pem'}\nKeyFile = {root / 'key.pem'}\n"
                           f"Ports = {self.tls_port}\n")
        (root / "ngircd.conf").write_text(
            "[Global]\nName = irc.test\nInfo = test server\nListen = 127.0.0.1\n"
            f"Ports = {self.port}\nMotdFile = {root / 'motd'}\nPidFile = {root / 'ngircd.pid'}\n"
            "[Limits]\nMaxConnectionsIP = 0\nPingTimeout = 120\nPongTimeout = 20\n"
            "[Options]\nPAM = no\nIdent = no\nDNS = no\n" + ssl_section)
        self.tls = tls

    def start(self) -> "Ngircd":
        ports = (self.port, self.tls_port) if self.tls else (self.port,)
        self.launch([self.binary, "-n", "-f", str(self.root / "ngircd.conf")], *ports)
        return self


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


class MailServers:
    """aiosmtpd (SMTP) delivering into per-user Maildirs that a real dovecot serves over IMAP.

    Users log in with their local part (`bot`, `alice`...) and the password `mailpass`.
    """

    PASSWORD = "mailpass"

    def __init__(self, root: Path, users: tuple[str, ...] = ("bot", "alice", "mallory")) -> None:
        self.binary = need("dovecot")
        pytest.importorskip("aiosmtpd", reason="aiosmtpd (test extra) is not installed")
        # dovecot's auth process runs as user dovecot: the directory must be traversable
        # (pytest's own tmp dirs are 0700), so use a fresh 0755 directory of our own.
        import tempfile
        self.root = Path(tempfile.mkdtemp(prefix="agentd-mail-"))
        os.chmod(self.root, 0o755)
        self.users = users
        self.imap_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.smtp = None
        self.received: list[bytes] = []

    @staticmethod
    def mail_ids() -> tuple[int, int]:
        """dovecot refuses to access mail as root: as root, mail belongs to `nobody`."""
        if os.getuid() != 0:
            return os.getuid(), os.getgid()
        import pwd
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid

    def own(self, path: Path) -> None:
        if os.getuid() != 0:
            return
        uid, gid = self.mail_ids()
        for dirpath, dirnames, filenames in os.walk(path):
            os.chown(dirpath, uid, gid)
            for name in filenames:
                os.chown(os.path.join(dirpath, name), uid, gid)

    def maildir(self, user: str) -> Path:
        return self.root / "mail" / user / "Maildir"

    def start(self) -> "MailServers":
        import mailbox

        from aiosmtpd.controller import Controller

        root = self.root
        for sub in ("run", "state", "mail"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for user in self.users:
            self.maildir(user).parent.mkdir(parents=True, exist_ok=True)
            mailbox.Maildir(str(self.maildir(user)), create=True)
        (root / "passwd").write_text("".join(f"{u}:{{PLAIN}}{self.PASSWORD}::::::\n" for u in self.users))
        uid, gid = self.mail_ids()
        self.own(root / "mail")
        (root / "dovecot.conf").write_text(f"""
protocols = imap
listen = 127.0.0.1
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
first_valid_uid = 0
mail_location = maildir:{root}/mail/%n/Maildir
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%n {root}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={root}/mail/%n
}}
service imap-login {{
  inet_listener imap {{
    port = {self.imap_port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service stats {{
  unix_listener stats-reader {{
    mode = 0666
  }}
  unix_listener stats-writer {{
    mode = 0666
  }}
}}
""")
        self.proc = subprocess.Popen([self.binary, "-F", "-c", str(root / "dovecot.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.imap_port)
        servers = self

        class Deliver:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd API
                servers.received.append(envelope.content)
                for rcpt in envelope.rcpt_tos:
                    user = rcpt.split("@", 1)[0].lower()
                    if user in servers.users:
                        mailbox.Maildir(str(servers.maildir(user))).add(envelope.content)
                        servers.own(servers.maildir(user))
                return "250 Message accepted for delivery"

        self.smtp = Controller(Deliver(), hostname="127.0.0.1", port=free_port())
        self.smtp.start()
        self.smtp_port = self.smtp.port
        return self

    def stop(self) -> None:
        if self.smtp is not None:
            self.smtp.stop()
            self.smtp = None
        end(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)

    def restart_imap(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(5)
        self.proc = subprocess.Popen([self.binary, "-F", "-c", str(self.root / "dovecot.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.imap_port)

    def send(self, sender: str, to: str, subject: str, body: str,
             files: tuple[tuple[str, str, bytes], ...] = (), **headers: str) -> str:
        """A user sends mail through the SMTP server (`files`: (filename, content type, bytes)
        attachments); returns its Message-ID."""
        import smtplib
        from email.message import EmailMessage
        from email.utils import make_msgid

        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = sender, to, subject
        msg["Message-ID"] = make_msgid(domain="test.example")
        for key, value in headers.items():
            msg[key.replace("_", "-")] = value
        msg.set_content(body)
        for filename, kind, data in files:
            maintype, _, subtype = kind.partition("/")
            msg.add_attachment(data, maintype=maintype, subtype=subtype, filename=filename)
        with smtplib.SMTP("127.0.0.1", self.smtp_port, timeout=10) as smtp:
            smtp.send_message(msg)
        return str(msg["Message-ID"])

    def inbox(self, user: str) -> list:
        import email
        import email.policy
        import mailbox

        box = mailbox.Maildir(str(self.maildir(user)), factory=None)
        return [email.message_from_bytes(box.get_bytes(key), policy=email.policy.default) for key in box.keys()]
