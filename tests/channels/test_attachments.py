"""The attachments module without a daemon: what a file's bytes say it is, which hosts a
download may touch (redirects included, credentials kept to their host), the size cap."""

from __future__ import annotations

import pytest
from flask import Flask, redirect, request

from agentd.channels.attachments import FileRefused, allowed, fetch, host_of
from agentd.filetypes import sniff
from fakellm import TINY_PNG
from fakes.http import FakeServer


class Host(FakeServer):
    """Serves bytes, redirects, and records the Authorization header of every request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.target = ""
        app = Flask("host")

        @app.route("/<path:path>")
        def serve(path: str):
            self.seen.append((path, request.headers.get("Authorization", "")))
            if path == "hop":
                return redirect(self.target, 302)
            if path == "big":
                return b"b" * 5000, 200, {"Content-Type": "application/octet-stream"}
            return TINY_PNG, 200, {"Content-Type": "image/png"}

        super().__init__(app)


@pytest.fixture(scope="module")
def hosts():
    one, two = Host().start(), Host().start()
    yield one, two
    one.stop()
    two.stop()


def test_sniffing_trusts_bytes_not_claims():
    assert sniff(TINY_PNG, "text/plain") == "image/png"
    assert sniff(b"%PDF-1.7\n...", "image/png") == "application/pdf"
    assert sniff("naïve café".encode(), "text/csv") == "text/csv"
    assert sniff(b"<svg onload=alert(1)>", "image/svg+xml") == "text/plain"
    assert sniff(b"<script>x</script>", "text/html") == "text/plain"
    assert sniff(b"\x00\x01\x02binary", "text/plain") == "application/octet-stream"
    assert sniff(b"\xff\xfe\xfa", "text/plain") == "application/octet-stream"


def test_only_listed_hosts_and_web_schemes():
    listed = {"files.slack.com", "127.0.0.1:8080"}
    assert allowed("https://files.slack.com/files-pri/T1-F1/a.png", listed)
    assert allowed("http://127.0.0.1:8080/x", listed)
    assert not allowed("http://127.0.0.1:8081/x", listed)
    assert not allowed("https://files.slack.com.evil.example/a.png", listed)
    assert not allowed("https://evil.example/?files.slack.com", listed)
    assert not allowed("file:///etc/passwd", listed | {""})
    assert not allowed("ftp://files.slack.com/a.png", listed)
    assert host_of("https://FILES.slack.com:443/a") == "files.slack.com"
    assert host_of("http://files.slack.com:443/a") == "files.slack.com:443"


def test_a_domain_entry_takes_its_subdomains_on_the_default_port_only():
    listed = {".fbcdn.net"}
    assert allowed("https://scontent-lhr8-1.xx.fbcdn.net/v/t1/a.jpg", listed)
    assert allowed("https://SCONTENT.xx.fbcdn.net/a.jpg", listed)
    assert not allowed("https://fbcdn.net/a.jpg", listed)
    assert not allowed("https://evilfbcdn.net/a.jpg", listed)
    assert not allowed("https://scontent.xx.fbcdn.net.evil.example/a.jpg", listed)
    assert not allowed("https://scontent.xx.fbcdn.net:8443/a.jpg", listed)


def test_redirects_stay_on_the_list_and_credentials_on_their_host(hosts):
    one, two = hosts
    listed = {host_of(one.url), host_of(two.url)}
    one.target = f"{two.url}/cat.png"
    assert fetch(f"{one.url}/hop", listed, {"Authorization": "Bearer xoxb-secret"}, 4096) == TINY_PNG
    assert one.seen[-1] == ("hop", "Bearer xoxb-secret") and two.seen[-1] == ("cat.png", "")
    one.target = f"{one.url}/cat.png"  # the same host: the token still goes
    fetch(f"{one.url}/hop", listed, {"Authorization": "Bearer xoxb-secret"}, 4096)
    assert one.seen[-1] == ("cat.png", "Bearer xoxb-secret")
    before = len(two.seen)
    one.target = f"{two.url}/cat.png"
    with pytest.raises(FileRefused, match=rf"not hosted by the platform \({host_of(two.url)}\)"):
        fetch(f"{one.url}/hop", {host_of(one.url)}, {}, 4096)
    assert len(two.seen) == before
    one.target = f"{one.url}/hop"  # a loop
    with pytest.raises(FileRefused, match="too many redirects"):
        fetch(f"{one.url}/hop", listed, {}, 4096)
    with pytest.raises(FileRefused, match="it is 5000 bytes; files up to 4096 bytes are accepted here"):
        fetch(f"{one.url}/big", listed, {}, 4096)
