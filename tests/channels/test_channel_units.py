"""Unit tests of the channel runtime's parts: TOML section editor, sender retries and
splitting, SSE parsing, dispatcher ordering, allow-list matching, config validation."""

from __future__ import annotations

import email.utils
import threading
import time
import tomllib

import pytest
import responses

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.allowlists import admits, recipients, refusal
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.webhook import within_window
from agentd.channels.catalog import ChannelCatalog, validate
from agentd.channels.dispatch import Dispatcher
from agentd.channels.start_retry import StartRetries
from agentd import hmacs
from agentd.channels.tomledit import ConfigEditError, edit_file, replace_section
from agentd.retry import Backoff, retry_after
from agentd.sse_lines import SseEvent, SseParser, lines_of, sse_events

DOC = """# top
api_key = ""  # keep

[channels]
listen_host = "127.0.0.1"

[channels.irc]
server = "a"

[channels.irc.overrides]
x = 1
# belongs to llm

[llm]
retries = 1
"""


def test_replace_section_keeps_everything_else():
    out = replace_section(DOC, ["channels", "irc"], {"server": "b", "port": 6667})
    assert out.startswith(DOC[:DOC.index("[channels.irc]")])
    assert out.endswith("# belongs to llm\n\n[llm]\nretries = 1\n")
    parsed = tomllib.loads(out)
    assert parsed["channels"]["irc"] == {"server": "b", "port": 6667}
    assert parsed["channels"]["listen_host"] == "127.0.0.1"


def test_remove_then_add_round_trips():
    removed = replace_section(DOC, ["channels", "irc"], None)
    assert "channels.irc" not in removed and "# belongs to llm" in removed and "x = 1" not in removed
    added = replace_section(DOC, ["channels", "telegram"], {"bot_token_env": "T"})
    assert added.startswith(DOC)
    assert replace_section(added, ["channels", "telegram"], None) == DOC


def test_edit_file_refuses_inline_definitions(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('channels = { irc = { server = "a" } }\n')
    with pytest.raises(ConfigEditError):
        edit_file(path, ["channels", "irc"], {"server": "b"})
    assert path.read_text() == 'channels = { irc = { server = "a" } }\n'  # untouched
    path.write_text("# c\n")
    edit_file(path, ["channels", "irc"], {"server": "b"})
    assert path.read_text() == '# c\n\n[channels.irc]\nserver = "b"\n'
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]  # no temp file left


def test_edits_keep_comments_and_layout_of_every_other_table():
    doc = ("# top\r\n[channels]  # header comment\r\nlisten_host = '127.0.0.1'   # odd spacing\r\n"
           "\r\n# about irc\r\n[channels.irc]\r\nserver = \"a\"\r\n\r\n[channels.slack]\r\n"
           "  app_token_env = \"S\"  # indented\r\n\r\n[llm]\r\nretries = 1\r\n")
    out = replace_section(doc, ["channels", "irc"], {"server": "b", "allowed_users": ["x", "y"]})
    assert out == doc.replace('[channels.irc]\r\nserver = "a"\r\n',
                              '[channels.irc]\nserver = "b"\nallowed_users = ["x", "y"]\n')
    removed = replace_section(doc, ["channels", "irc"], None)
    assert removed == doc.replace('[channels.irc]\r\nserver = "a"\r\n', "")
    assert replace_section(doc, ["channels", "slack"], None) == doc.replace(
        '[channels.slack]\r\n  app_token_env = "S"  # indented\r\n\r\n', "")


def test_edits_of_a_table_whose_parent_has_no_header():
    doc = '[channels.irc]\nserver = "a"\n# about slack\n[channels.slack]\nt = 1\n'
    assert replace_section(doc, ["channels", "irc"], None) == "# about slack\n[channels.slack]\nt = 1\n", \
        "no [channels] header appears, the closing comment stays with what follows"
    assert replace_section(doc, ["channels", "slack"], None) == '[channels.irc]\nserver = "a"\n# about slack\n'
    assert replace_section(doc, ["channels", "irc"], {"server": "b", "o": {"x": 1}}) == (
        '[channels.irc]\nserver = "b"\n\n[channels.irc.o]\nx = 1\n\n# about slack\n[channels.slack]\nt = 1\n')
    assert replace_section(doc, ["channels", "irc"], {}) == '[channels.irc]\n\n# about slack\n[channels.slack]\nt = 1\n'
    # A table defined after others (out of order, valid TOML) is edited where it is.
    late = '[channels.slack]\nt = 1\n\n[llm]\nr = 1\n\n[channels.irc]\nserver = "a"\n'
    assert replace_section(late, ["channels", "irc"], None) == '[channels.slack]\nt = 1\n\n[llm]\nr = 1\n'
    assert replace_section(late, ["channels", "irc"], {"server": "b"}) == late.replace('"a"', '"b"')


def test_edit_file_refuses_dotted_keys_and_reports_a_broken_file(tmp_path):
    path = tmp_path / "config.toml"
    for text in ('channels.irc.server = "a"\n', '[channels]\nirc.server = "a"\n'):
        path.write_text(text)
        with pytest.raises(ConfigEditError, match=r"\[channels.irc\] is defined in a form this editor does not rewrite"):
            edit_file(path, ["channels", "irc"], None)
        assert path.read_text() == text
    path.write_text("this is = = not toml")
    with pytest.raises(ConfigEditError, match="the edited file would not parse") as caught:
        edit_file(path, ["channels", "irc"], {"server": "b"})
    assert caught.value.status == 409 and path.read_text() == "this is = = not toml"


@responses.activate
def test_sender_retries_429_honouring_retry_after():
    url = "http://platform.test/send"
    responses.post(url, status=429, headers={"Retry-After": "0.3"}, json={})
    responses.post(url, status=503, json={})
    responses.post(url, status=200, json={"ok": True})
    sender = HttpSender(retries=3)
    start = time.monotonic()
    assert sender.json("POST", url, json={}) == {"ok": True}
    assert time.monotonic() - start >= 0.3
    assert len(responses.calls) == 3


@responses.activate
def test_sender_gives_up_and_stops():
    url = "http://platform.test/send"
    responses.post(url, status=400, json={"description": "bad chat"})
    with pytest.raises(ChannelError, match="HTTP 400"):
        HttpSender().request("POST", url)
    responses.replace(responses.POST, url, status=429, headers={"Retry-After": "30"})
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(ChannelError, match="stopped"):
        HttpSender(stop=stop).request("POST", url)


@responses.activate
def test_sender_honours_retry_after_as_an_http_date():
    url = "http://platform.test/send"
    when = email.utils.formatdate(time.time() + 2, usegmt=True)
    responses.post(url, status=429, headers={"Retry-After": when}, json={})
    responses.post(url, status=200, json={"ok": True})
    start = time.monotonic()
    assert HttpSender(retries=1).json("POST", url, json={}) == {"ok": True}
    # Whole seconds: 2 s ahead is 1-2 s of waiting, well above the first backoff (0.5 s ±20 %).
    assert 0.95 <= time.monotonic() - start < 3


@pytest.mark.parametrize("value, seconds", [
    ("2", 2.0), (" 120 ", 120.0), ("1.5", 1.5), ("0", 0.0),
    ("Wed, 21 Oct 2015 07:28:20 GMT", 20.0),   # 20 s after `now` below
    ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),    # in the past: now
    ("Wed, 21 Oct 2015 07:28:00 -0000", 0.0),
    ("Fri, 31 Dec 9999 23:59:59 GMT", 86400.0),  # at most a day
    ("99999999", 86400.0),
    (None, None), ("", None), ("soon", None), ("-1", None), ("inf", None), ("nan", None), ("1e999", None),
    ("Wed, 32 Oct 2015 07:28:00 GMT", None),
])
def test_retry_after_reads_seconds_and_http_dates(value, seconds):
    now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
    assert retry_after(value, now=now) == seconds


def test_backoff_doubles_with_jitter_up_to_its_maximum_and_resets():
    delays = [Backoff(initial=0.5, maximum=4.0) for _ in range(50)]
    runs = [[b.next_delay() for _ in range(6)] for b in delays]
    for n, base in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        nth = [run[n] for run in runs]
        assert all(0.8 * base <= d <= 1.2 * base for d in nth), nth
        assert len(set(nth)) > 1, "BUG: no jitter"
    backoff = delays[0]
    backoff.reset()
    assert 0.4 <= backoff.next_delay() <= 0.6
    stop = threading.Event()
    stop.set()
    assert backoff.wait(stop) is True


def test_sse_parsing():
    lines = [": comment", "event: open", "data: {}", "", "id: 7", "data: line1", "data: line2", "", "",
             "event: name-only", "", "data", "", "data:x", "data:  y", "retry: 5", "unknown", "", "data: tail"]
    assert list(sse_events(iter(lines))) == [SseEvent("open", "{}"), SseEvent("", "line1\nline2"),
                                             SseEvent("", ""), SseEvent("", "x\n y"), SseEvent("", "tail")]
    parser = SseParser()
    assert [parser.feed(line) for line in ["event: a", "data: 1", ""]] == [None, None, SseEvent("a", "1")]
    assert parser.feed("data: 2") is None and parser.end() == SseEvent("", "2") and parser.end() is None


def test_sse_lines_from_chunks_of_any_size():
    body = "event: ä\r\ndata: {\"t\": \"a\u2028b\"}\n\ndata: last".encode()
    whole = list(lines_of([body]))
    assert whole == ["event: ä", 'data: {"t": "a\u2028b"}', "", "data: last"]
    assert list(lines_of(body[i:i + 1] for i in range(len(body)))) == whole, "a line split across reads"
    assert list(lines_of([b"a\n\xff\n", b"", b"b\r\n"])) == ["a", "\ufffd", "b"] and list(lines_of([])) == []


def test_hmac_helpers():
    body = b'{"a":1}'
    # RFC 4231 test case 2 (HMAC-SHA256), and the same key and text as SHA-1.
    assert hmacs.hex_digest("Jefe", "what do ya want for nothing?") == \
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert hmacs.hex_digest(b"Jefe", b"what do ya want for nothing?", "sha1") == \
        "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
    assert hmacs.b64_digest("Jefe", "what do ya want for nothing?") == "W9zBRr9gdU5qBCQmCJV1x1oAPwidJzmDnexYuWTsOEM="
    assert hmacs.digest("Jefe", "what do ya want for nothing?").hex() == hmacs.hex_digest("Jefe", "what do ya want for nothing?")
    good = "sha256=" + hmacs.hex_digest("k", body)
    assert hmacs.check("k", body, good, prefix="sha256=")
    assert hmacs.check("k", body, "  " + good.upper().replace("SHA256=", "sha256=") + " ", prefix="sha256=")
    assert not hmacs.check("k", body + b" ", good, prefix="sha256=")
    assert not hmacs.check("j", body, good, prefix="sha256=")
    assert not hmacs.check("k", body, good[len("sha256="):], prefix="sha256="), "the prefix is required"
    assert not hmacs.check("k", body, None) and not hmacs.check("k", body, "") and not hmacs.check("", body, good)
    assert not hmacs.check(None, body, hmacs.hex_digest("", body)), "no key: nothing verifies"
    b64 = hmacs.b64_digest("k", body)
    assert hmacs.check("k", body, b64, encoding="base64") and not hmacs.check("k", body, b64.lower(), encoding="base64")
    assert hmacs.check("k", body, hmacs.hex_digest("k", body, "sha1"), algorithm="sha1")
    assert not hmacs.check("k", body, hmacs.hex_digest("k", body), algorithm="sha1")
    assert hmacs.same("abc", "abc") and hmacs.same(b"abc", "abc") and not hmacs.same("abd", "abc")
    assert not hmacs.same("", "") and not hmacs.same(None, "abc"), "nothing presented never matches"
    assert not hmacs.same("\udcff", "?") and hmacs.same("ä\udcff", "ä\udcff"), "undecodable input is itself"
    with pytest.raises(ValueError):
        hmacs.check("k", body, "x", encoding="base32")
    assert within_window(str(time.time())) and not within_window(str(time.time() - 3600))
    assert not within_window("not a number")


def test_dispatcher_orders_per_key_and_parallelises_keys():
    dispatcher = Dispatcher(workers=4, queue_limit=3)
    seen: list[tuple[str, int]] = []
    gate = threading.Event()
    running = []

    def job(key: str, n: int):
        def run():
            running.append(key)
            if key == "a":
                gate.wait(5)
            seen.append((key, n))
        return run

    assert dispatcher.submit("a", job("a", 1))
    for n in (2, 3):
        assert dispatcher.submit("a", job("a", n))
    assert not dispatcher.submit("a", job("a", 4))  # queue of 3 is full: dropped, not blocked
    assert dispatcher.submit("b", job("b", 1))
    deadline = time.monotonic() + 5
    while ("b", 1) not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ("b", 1) in seen and ("a", 1) not in seen  # b ran while a was blocked
    gate.set()
    while len(seen) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [n for k, n in seen if k == "a"] == [1, 2, 3]
    dispatcher.close()


def test_allow_lists():
    conv = Conversation("irc", "#room", "bob")
    msg = Inbound(conv, sender_id="Bob", text="hi", sender_aliases=("bobby",))
    assert refusal({}, msg) == ""
    assert refusal({"allowed_users": ["bob"]}, msg) == ""
    assert refusal({"allowed_users": ["BOBBY"]}, msg) == ""
    assert refusal({"allowed_users": ["alice"]}, msg) == "sender not in allowed_users"
    assert refusal({"allowed_channels": ["#other"]}, msg) == "chat not in allowed_channels"
    assert refusal({"allowed_rooms": ["#room"]}, msg) == ""
    mail = Inbound(Conversation("email", "a@corp.example", "a@corp.example", direct=True), "a@corp.example", "x")
    assert refusal({"allowed_senders": ["@corp.example"]}, mail) == ""
    assert refusal({"allowed_senders": ["@other.example"]}, mail) != ""
    # Whom an agent may send to: a sender the lists let in, or a listed chat; anyone without lists.
    assert admits({}, "anyone")
    assert admits({"allowed_senders": ["@corp.example"]}, "A@Corp.example")
    assert not admits({"allowed_senders": ["@corp.example"]}, "a@other.example")
    assert admits({"allowed_users": ["bob"], "allowed_channels": ["#room"]}, "#Room")
    assert not admits({"allowed_channels": ["#room"]}, "bob")
    assert recipients({}) == set()
    assert recipients({"allowed_users": ["Bob"], "allowed_rooms": ["#Room"], "streams": ["dev"],
                       "allowed_tenants": ["t1"]}) == {"bob", "#room", "dev"}


def test_validate_normalises():
    info = ChannelCatalog.load().get("email")
    values = validate(info, {"imap_port": "993", "allowed_senders": "a@x, b@y", "password_env": "MAIL_PW"})
    assert values == {"imap_port": 993, "allowed_senders": ["a@x", "b@y"], "password_env": "MAIL_PW"}
    assert validate(info, {"fields": {"username": "me"}}) == {"username": "me"}


def test_email_html_only_mail_is_read_as_text():
    from agentd.channels.adapters.email import _html_text

    assert _html_text("<p>Hello <b>there</b></p><p>line2</p>") == "\nHello there\nline2"


def test_start_retries_wait_twice_as_long_each_time_and_stop_when_forgotten() -> None:
    started: list[str] = []
    retries = StartRetries(started.append)
    assert [retries.later("slack") for _ in range(8)] == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    assert retries.pending("slack") and not retries.pending("matrix")
    retries.forget("slack")
    assert not retries.pending("slack") and retries.later("slack") == 5.0  # the first wait again
    retries.close()
    assert retries.closed and not retries.pending("slack")
    time.sleep(0.1)
    assert started == []
