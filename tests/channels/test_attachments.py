"""The attachments module without a daemon: what a file's bytes say it is, which hosts a
download may touch (redirects included, credentials kept to their host), the size cap, what
a message's files become (uploads, inbox copies, notes for the model, sentences for the
sender) and which of a run's files go back. The adapters' file tests drive it through a daemon."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest
from flask import Flask, Response, redirect, request

from agentd.agents.handle import UPLOAD_LIMIT
from agentd.channels.attachments import Attachment, ChannelFiles, FileRefused, allowed, fetch, host_of, with_bearer
from agentd.errors import BadRequest
from agentd.filetypes import sniff
from agentd.llm.catalog import Catalog
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
            if path == "stream":  # no Content-Length: the cap is found while reading
                return Response((b"s" * 1000 for _ in range(5)), 200, {"Content-Type": "text/plain"})
            if path == "gone":
                return "gone", 404
            if path == "bad":
                return "bad request", 400
            if path == "slow":
                time.sleep(1.5)
            if path == "relative":
                return "", 302, {"Location": "/cat.png"}
            if path.startswith("chain/"):  # chain/<n>: n redirects before the file
                n = int(path.split("/")[1])
                return redirect(f"/chain/{n - 1}" if n > 1 else "/cat.png", 302)
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
    assert host_of("http://files.slack.com:80/a") == "files.slack.com"
    assert host_of("https://files.slack.com:80/a") == "files.slack.com:80"


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
    with pytest.raises(FileRefused, match="^it is behind too many redirects$"):
        fetch(f"{one.url}/hop", listed, {}, 4096)
    with pytest.raises(FileRefused, match="it is 5000 bytes; files up to 4096 bytes are accepted here"):
        fetch(f"{one.url}/big", listed, {}, 4096)


# -- ChannelFiles: a message's files into uploads and the workspace, a run's files back out --

PDF = b"%PDF-1.7\n1 0 obj\n"
BMP = b"BM" + b"\x00" * 60


class Uploads:
    """The agent's uploads as ChannelFiles uses them: what was saved, read back by id."""

    def __init__(self) -> None:
        self.saved: dict[str, dict] = {}
        self.refuse: str = ""

    def save_for(self, agent_id: str, filename: str, content_type: str, data: bytes) -> dict:
        if self.refuse:
            raise BadRequest(self.refuse)
        file_id = str(uuid.uuid4())
        self.saved[file_id] = {"agent": agent_id, "filename": filename, "content_type": content_type, "data": data}
        return {"file_id": file_id}

    def read(self, handle, file_id: str) -> dict:
        row = self.saved.get(file_id)
        if row is None or row["agent"] != handle.id:
            raise BadRequest(f"unknown attachment file_id {file_id}")
        return row


@pytest.fixture
def files(tmp_path):
    uploads = Uploads()
    return ChannelFiles(uploads, Catalog.load(), tmp_path / "workspaces"), uploads


def agent(tmp_path, model: str = "gpt-4o", workspace=None) -> SimpleNamespace:
    """The agent as ChannelFiles reads it (tmp_path/workspaces/filer unless it has its own)."""
    return SimpleNamespace(id="agent-1", name="filer", model=model, workspace=workspace)


def test_an_image_reaches_a_vision_model_and_is_kept_in_the_inbox(files, tmp_path):
    channel, uploads = files
    handle = agent(tmp_path)
    got = channel.receive(set(), handle, [Attachment("cat.png", "image/png", data=TINY_PNG)], 4096)
    [(file_id, saved)] = uploads.saved.items()
    assert saved == {"agent": "agent-1", "filename": "cat.png", "content_type": "image/png", "data": TINY_PNG}
    assert got.images == [{"file_id": file_id}] and got.refused == []
    assert got.notes == [f"[image cat.png (image/png, {len(TINY_PNG)} bytes) attached; saved as inbox/cat.png, "
                         f"file_id {file_id}]"]
    assert (tmp_path / "workspaces" / "filer" / "inbox" / "cat.png").read_bytes() == TINY_PNG


def test_images_a_model_cannot_see_and_other_files_become_notes(files, tmp_path):
    channel, _ = files
    blind = channel.receive(set(), agent(tmp_path, "gpt-3.5-turbo"), [Attachment("cat.png", data=TINY_PNG)], 4096)
    assert blind.images == []
    assert blind.notes[0].startswith(f"[image cat.png (image/png, {len(TINY_PNG)} bytes) received; "
                                     "saved as inbox/cat.png, file_id ")
    assert blind.notes[0].endswith("; this model cannot see images]")
    odd = channel.receive(set(), agent(tmp_path), [Attachment("old.bmp", "image/bmp", data=BMP)], 4096)
    assert odd.images == [] and odd.notes[0].endswith("; the model is not shown this format]")
    assert odd.notes[0].startswith(f"[image old.bmp (image/bmp, {len(BMP)} bytes) received; saved as inbox/old.bmp")
    text = channel.receive(set(), agent(tmp_path), [Attachment("notes.csv", "text/csv; charset=utf-8",
                                                                  data=b"a,b\n1,2\n")], 4096)
    assert text.images == [] and text.notes[0].startswith("[file notes.csv (text/csv, 8 bytes) received; "
                                                          "saved as inbox/notes.csv, file_id ")
    assert text.notes[0].endswith("; read it with the file tools]")


def test_the_run_model_and_the_agents_own_must_both_see_images(files, tmp_path):
    channel, _ = files
    chosen = channel.receive(set(), agent(tmp_path, "gpt-4o"), [Attachment("a.png", data=TINY_PNG)], 4096,
                             model="gpt-3.5-turbo")
    assert chosen.images == [] and chosen.notes[0].endswith("; this model cannot see images]")
    assert channel.sees_images(agent(tmp_path, "gpt-4o"))
    assert channel.sees_images(agent(tmp_path, "gpt-4o"), "gpt-4o-mini")
    assert not channel.sees_images(agent(tmp_path, "gpt-4o"), "gpt-3.5-turbo")
    assert not channel.sees_images(agent(tmp_path, "gpt-3.5-turbo"), "gpt-4o")
    assert channel.sees_images(agent(tmp_path, "no-such-model"), "gpt-4o")  # unknown own model: the run's decides
    assert not channel.sees_images(agent(tmp_path, "no-such-model"))


def test_names_are_made_safe_and_earlier_files_are_kept(files, tmp_path):
    channel, _ = files
    handle = agent(tmp_path)
    items = [Attachment(name, "text/plain", data=b"x") for name in
             ("a.txt", "a.txt", "a.txt", "README", "README", "../../etc/pass\x00wd", "..hidden", "  ",
              "x" * 200 + ".txt", "", "Xmas.txt", "site.tar.gz", "site.tar.gz")]
    got = channel.receive(set(), handle, items, 4096)
    saved = [note.split("saved as ", 1)[1].split(",")[0] for note in got.notes]
    assert saved == ["inbox/a.txt", "inbox/a-1.txt", "inbox/a-2.txt", "inbox/README", "inbox/README-1",
                     "inbox/_.._etc_pass_wd", "inbox/hidden", "inbox/file", "inbox/" + "x" * 116 + ".txt",
                     "inbox/file-1", "inbox/Xmas.txt", "inbox/site.tar.gz", "inbox/site.tar-1.gz"]
    inbox = tmp_path / "workspaces" / "filer" / "inbox"
    assert sorted(p.name for p in inbox.iterdir()) == sorted(s.split("/", 1)[1] for s in saved)


def test_the_workspace_is_the_agents_own_when_it_has_one(files, tmp_path):
    channel, _ = files
    own = tmp_path / "own"
    got = channel.receive(set(), agent(tmp_path, workspace=own), [Attachment("a.txt", data=b"hello")], 4096)
    assert got.refused == [] and (own / "inbox" / "a.txt").read_bytes() == b"hello"
    assert channel.workspace(agent(tmp_path)) == tmp_path / "workspaces" / "filer"


def test_an_inbox_linked_out_of_the_workspace_is_refused(files, tmp_path):
    channel, _ = files
    root = tmp_path / "own"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "inbox").symlink_to(tmp_path / "elsewhere")
    got = channel.receive(set(), agent(tmp_path, workspace=root), [Attachment("a.txt", data=b"hello")], 4096)
    assert got.refused == ["Sorry, I could not take a.txt: the agent's inbox/ folder is not inside its workspace."]
    assert list((tmp_path / "elsewhere").iterdir()) == [] and got.notes == []


def test_files_are_refused_with_a_sentence_for_the_sender(files, tmp_path, hosts):
    channel, uploads = files
    one, _ = hosts
    listed = {host_of(one.url)}
    fetched = len(one.seen)

    def broken() -> str:
        raise RuntimeError("no file path")

    def unreadable(data: bytes) -> bytes:
        raise ValueError("bad blob")

    items = [
        Attachment("fake.png", "image/png", data=PDF),
        Attachment("blob.bin", "application/octet-stream", data=b"\x00\x01\x02"),
        Attachment("big.pdf", "application/pdf", size=4097, url=f"{one.url}/cat.png"),
        Attachment("huge.txt", "text/plain", data=b"x" * 4097),
        Attachment("empty.txt", "text/plain", data=b""),
        Attachment("lost.png", "image/png", locate=broken),
        Attachment("sealed.png", "image/png", url=f"{one.url}/cat.png", open=unreadable),
    ]
    got = channel.receive(listed, agent(tmp_path), items, 4096)
    assert got.refused == [
        "Sorry, I could not take fake.png: it is not the image it claims to be (its bytes are application/pdf).",
        "Sorry, I could not take blob.bin: application/octet-stream files are not accepted here "
        "(images, text, PDF and audio are).",
        "Sorry, I could not take big.pdf: it is 4097 bytes; files up to 4096 bytes are accepted here.",
        "Sorry, I could not take huge.txt: it is 4097 bytes; files up to 4096 bytes are accepted here.",
        "Sorry, I could not take empty.txt: it is empty.",
        "Sorry, I could not take lost.png: the platform did not say where it is (RuntimeError).",
        "Sorry, I could not take sealed.png: it could not be opened (ValueError).",
    ]
    assert got.notes == [] and got.images == [] and uploads.saved == {}
    assert len(one.seen) == fetched + 1  # only the sealed file was downloaded: a declared size over the cap never is
    assert list((tmp_path / "workspaces").rglob("*.*")) == []
    uploads.refuse = "unsupported content type"
    refused = channel.receive(set(), agent(tmp_path), [Attachment("a.txt", data=b"x"), Attachment("b.txt", data=b"y")],
                              4096)
    assert refused.refused == ["Sorry, I could not take a.txt: unsupported content type.",
                               "Sorry, I could not take b.txt: unsupported content type."]
    # A file exactly at the cap is taken, its declared size included.
    uploads.refuse = ""
    exact = channel.receive(set(), agent(tmp_path), [Attachment("a.txt", size=5, data=b"12345")], 5)
    assert exact.refused == []


def test_a_file_is_fetched_where_the_platform_says_only_when_needed(files, tmp_path, hosts):
    channel, uploads = files
    one, _ = hosts
    asked: list[str] = []

    def token() -> str:
        asked.append("token")
        return "t-1"

    item = with_bearer(Attachment("cat.png", "image/png", url=f"{one.url}/cat.png"), token)
    assert asked == [] and item.headers == {}
    opened: list[bytes] = []
    item.open = lambda data: opened.append(data) or data
    got = channel.receive({host_of(one.url)}, agent(tmp_path), [item], 4096)
    assert asked == ["token"] and one.seen[-1] == ("cat.png", "Bearer t-1") and opened == [TINY_PNG]
    assert len(got.images) == 1 and list(uploads.saved.values())[0]["data"] == TINY_PNG


def test_downloads_that_fail_say_why(hosts):
    one, _ = hosts
    listed = {host_of(one.url)}
    one.target = f"{one.url}/missing-target"
    with pytest.raises(FileRefused, match=r"^it could not be downloaded \(HTTP 404\)$"):
        fetch(f"{one.url}/gone", listed, {}, 4096)
    with pytest.raises(FileRefused, match=r"^it could not be downloaded \(ConnectionError\)$"):
        fetch("http://127.0.0.1:9/x", {"127.0.0.1:9"}, {}, 4096)
    with pytest.raises(FileRefused, match=r"^it is over 4000 bytes, the most accepted here$"):
        fetch(f"{one.url}/stream", listed, {}, 4000)
    assert fetch(f"{one.url}/big", listed, {}, 5000) == b"b" * 5000
    assert fetch(f"{one.url}/stream", listed, {}, 5000) == b"s" * 5000
    with pytest.raises(FileRefused, match=r"^it is not hosted by the platform \(no host\)$"):
        fetch("https:///x", listed, {}, 4096)
    with pytest.raises(FileRefused, match=r"^it could not be downloaded \(HTTP 400\)$"):
        fetch(f"{one.url}/bad", listed, {}, 4096)
    started = time.monotonic()
    with pytest.raises(FileRefused, match=r"^it could not be downloaded \(ReadTimeout\)$"):
        fetch(f"{one.url}/slow", listed, {}, 4096, timeout=0.3)
    assert time.monotonic() - started < 1.2


def test_redirects_relative_ones_included_are_followed_three_deep(hosts, monkeypatch):
    one, _ = hosts
    listed = {host_of(one.url)}
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy"):  # a proxy of the environment is never used
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    assert fetch(f"{one.url}/relative", listed, {}, 4096) == TINY_PNG
    assert fetch(f"{one.url}/chain/3", listed, {}, 4096) == TINY_PNG
    with pytest.raises(FileRefused, match="^it is behind too many redirects$"):
        fetch(f"{one.url}/chain/4", listed, {}, 4096)


def run_result(tool_calls: list[dict], messages: list[dict]) -> SimpleNamespace:
    defaults = {"role": "tool", "is_error": False, "tool_name": "", "tool_call_id": "", "content": ""}
    return SimpleNamespace(tool_calls=tool_calls, new_messages=[SimpleNamespace(**{**defaults, **m}) for m in messages])


def test_a_runs_files_go_back_once_each_in_the_order_made(files, tmp_path):
    channel, uploads = files
    handle = agent(tmp_path)
    output = tmp_path / "workspaces" / "filer" / "output"
    output.mkdir(parents=True)
    (output / "report.txt").write_bytes(b"the report")
    (output / "data.csv").write_bytes(b"a,b\n1,2\n")  # text: its name says which kind
    (output / "empty.txt").write_bytes(b"")
    (output / "largest.txt").write_bytes(b"x" * UPLOAD_LIMIT)
    (output / "too-large.txt").write_bytes(b"x" * (UPLOAD_LIMIT + 1))
    (tmp_path / "workspaces" / "filer" / "secret.txt").write_bytes(b"not for the chat")
    image = uploads.save_for("agent-1", "chart.png", "image/png", TINY_PNG)["file_id"]
    speech = uploads.save_for("agent-1", "speech.mp3", "audio/mpeg", b"ID3 speech")["file_id"]
    said = uploads.save_for("agent-1", "said.txt", "text/plain", b"said")["file_id"]
    unsent = uploads.save_for("agent-1", "unsent.txt", "text/plain", b"unsent")["file_id"]
    others = uploads.save_for("agent-2", "theirs.png", "image/png", TINY_PNG)["file_id"]
    paths = ["output/report.txt", "output/report.txt", "secret.txt", "output/../secret.txt", "output/empty.txt",
             "output/missing.txt", "output/report.txt", "output/data.csv", "output/largest.txt",
             "output/too-large.txt"]
    calls = [{"id": f"c{i}", "arguments": {"path": path}} for i, path in enumerate(paths)]
    messages = [{"role": "assistant", "content": f'{{"file_id": "{unsent}"}}'},
                {"tool_name": "image_generate", "is_error": True, "content": f'{{"file_id": "{unsent}"}}'},
                {"tool_name": "file_write", "tool_call_id": "c0"},
                {"tool_name": "image_generate", "content": f'{{"file_id": "{image}"}}'},
                {"tool_name": "file_write", "tool_call_id": "no-such-call"},
                *({"tool_name": "file_write", "tool_call_id": f"c{i}"} for i in range(1, 6)),
                {"tool_name": "file_write", "tool_call_id": "c6", "is_error": True},
                {"tool_name": "speak", "content": f'{{"file_id":  "{image}"}} {{"file_id": "{speech}"}}'},
                {"tool_name": "recall", "content": f'{{"file_id": "{others}"}}, {{"file_id": "{said}"}}'},
                *({"tool_name": "file_write", "tool_call_id": f"c{i}"} for i in (7, 8, 9))]
    out = channel.outgoing(handle, run_result(calls, messages))
    assert [(o.filename, o.content_type, len(o.data)) for o in out] == [
        ("report.txt", "text/plain", 10), ("chart.png", "image/png", len(TINY_PNG)), ("speech.mp3", "audio/mpeg", 10),
        ("said.txt", "text/plain", 4), ("data.csv", "text/csv", 8), ("largest.txt", "text/plain", UPLOAD_LIMIT)]
