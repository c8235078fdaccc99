"""A real nginx in front of a test daemon, running docs/nginx-agentd.conf.

The site file is the one docs/deploy.md shows; only the listen address, the
certificate paths and the daemon's port are replaced (each replacement must
match exactly once, so the doc and the tested file cannot drift apart).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE_CONF = ROOT / "docs" / "nginx-agentd.conf"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
PUBLIC_NAME = "agentd.example.com"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def lan_address() -> str | None:
    """A non-loopback address of this machine that we can connect to, if any: a
    connection to it comes from a non-loopback peer, like a remote client's."""
    candidates = []
    for probe in ("192.0.2.1", "10.255.255.255", "8.8.8.8"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((probe, 9))
                candidates.append(s.getsockname()[0])
            except OSError:
                continue
    for addr in candidates:
        if addr.startswith("127."):
            continue
        with socket.socket() as s:
            try:
                s.bind((addr, 0))
                return addr
            except OSError:
                continue
    return None


def make_cert(directory: Path, lan: str | None) -> tuple[Path, Path]:
    """A self-signed certificate for the public name, 127.0.0.1 and the LAN address."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    san = f"DNS:{PUBLIC_NAME},IP:127.0.0.1" + (f",IP:{lan}" if lan else "")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "2", "-subj", f"/CN={PUBLIC_NAME}", "-addext", f"subjectAltName={san}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def site_config(port: int, daemon_port: int, cert: Path, key: Path, lan: str | None) -> str:
    """docs/nginx-agentd.conf with test ports and paths."""
    text = SITE_CONF.read_text()
    listen = f"listen 127.0.0.1:{port} ssl;" + (f"\n    listen {lan}:{port} ssl;" if lan else "")
    for old, new in [("listen 443 ssl;", listen),
                     (f"/etc/letsencrypt/live/{PUBLIC_NAME}/fullchain.pem", str(cert)),
                     (f"/etc/letsencrypt/live/{PUBLIC_NAME}/privkey.pem", str(key)),
                     ("server 127.0.0.1:4200;", f"server 127.0.0.1:{daemon_port};")]:
        assert text.count(old) == 1, f"{SITE_CONF.name} no longer contains {old!r} exactly once"
        text = text.replace(old, new)
    return text


class Nginx:
    """nginx -c <conf> -p <tmpdir> in the foreground, everything inside the tmpdir."""

    def __init__(self, daemon_port: int, lan: str | None = None) -> None:
        # Not under pytest's 0700 tmp dirs: workers run as nobody and need the temp paths.
        self.dir = Path(tempfile.mkdtemp(prefix="agentd-nginx-"))
        os.chmod(self.dir, 0o755)
        self.lan = lan
        self.port = _free_port()
        self.cert, self.key = make_cert(self.dir, lan)
        temps = "\n".join(f"    {kind}_temp_path {self.dir / kind};"
                          for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.dir / kind).mkdir(mode=0o777)
            os.chmod(self.dir / kind, 0o777)
        site = site_config(self.port, daemon_port, self.cert, self.key, lan)
        (self.dir / "nginx.conf").write_text(
            f"daemon off;\nworker_processes 1;\npid {self.dir / 'nginx.pid'};\n"
            f"error_log {self.dir / 'error.log'} info;\n"
            "events { worker_connections 256; }\n"
            f"http {{\n    access_log {self.dir / 'access.log'};\n{temps}\n"
            f"    default_type application/octet-stream;\n{site}\n}}\n")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def lan_url(self) -> str:
        return f"https://{self.lan}:{self.port}"

    def start(self) -> "Nginx":
        self.proc = subprocess.Popen([NGINX, "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir),
                                      "-e", str(self.dir / "error.log")],
                                     stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr.log", "wb"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nginx did not listen: {self.log()}")

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.dir / "stderr.log", self.dir / "error.log")
                       if p.exists())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
