"""Replies in each platform's own format, through the real daemon: the agent's Markdown as
Slack mrkdwn, Telegram HTML (parsed by the fake as the Bot API does), Matrix HTML with a
plain body, Discord Markdown that pings no one and plain IRC lines; long replies split at
each platform's limit; `overrides.output_format` per channel."""

from __future__ import annotations

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import configure, wait_active, wait_for
from fakes.servers import IrcUser, Ngircd

# The fake model answers "echo: <what the user wrote>": users write the agent's Markdown.
TRICKY = """Steps:

1. Install with `pip install "a<b"`
   - on *Linux*: use **apt & pip**
2. Read [the docs](https://example.com/d?a=1&b=2)

```python
if a < b:
    print("&amp;")
```"""


def fixture_for(name: str):  # type: ignore[no-untyped-def]
    @pytest.fixture
    def fake(daemon):  # noqa: F811
        yield from contract.serve(daemon, contract.CASES[name])
    return fake


slack, telegram, matrix, discord = (fixture_for(n) for n in ("slack", "telegram", "matrix", "discord"))


def reply_of(case_name: str, fake, daemon, text: str, count: int = 1, **extra):  # type: ignore[no-untyped-def]  # noqa: F811
    case = contract.CASES[case_name]
    contract.setup(daemon, case, fake, **extra)
    chat = case.say(fake, case.user, text)
    wait_for(lambda: len(case.replies(fake, chat)) >= count, what=f"{case_name} reply")
    return chat


def test_slack_gets_mrkdwn(daemon, slack):  # noqa: F811
    reply_of("slack", slack, daemon, TRICKY)
    sent = slack.sent[-1]
    assert sent["mrkdwn"] is True
    assert sent["text"] == """echo: Steps:

1. Install with `pip install "a&lt;b"`
   • on _Linux_: use *apt &amp; pip*
2. Read <https://example.com/d?a=1&amp;b=2|the docs>

```
if a &lt; b:
    print("&amp;amp;")
```"""


def test_slack_shows_escaped_markers_as_written_and_table_links(daemon, slack):  # noqa: F811
    reply_of("slack", slack, daemon, "price \\*not bold\\* and 2 * 3 or **foo**bar\n\n"
                                     "| h1 | h2 |\n|---|---|\n| [cell](https://cell.example/z) | **b** |")
    assert slack.sent[-1]["text"] == (
        "echo: price \u2060*\u2060not bold\u2060*\u2060 and 2 * 3 or *foo*\u200bbar\n\n"
        "*h1* | *h2*\n<https://cell.example/z|cell> | *b*")


def test_telegram_gets_html_the_bot_api_parses(daemon, telegram):  # noqa: F811
    chat = reply_of("telegram", telegram, daemon, TRICKY)
    sent = telegram.sent[-1]
    assert sent["parse_mode"] == "HTML"
    assert sent["text"] == """echo: Steps:

1. Install with pip install "a<b"
   • on Linux: use apt & pip
2. Read the docs

if a < b:
    print("&amp;")"""
    kinds = {(e["type"], e.get("url") or e.get("language")) for e in sent["entities"]}
    assert kinds == {("code", None), ("italic", None), ("bold", None),
                     ("text_link", "https://example.com/d?a=1&b=2"), ("pre", "python")}
    code = next(e for e in sent["entities"] if e["type"] == "code")
    assert sent["text"][code["offset"]:code["offset"] + code["length"]] == 'pip install "a<b"'

    # A code block longer than a message: every part is accepted (4096 UTF-16 units after
    # parsing) and reopens the block; the emoji (two units each) are never cut.
    code_lines = [f"print('✅ {n:03d} 😀')" for n in range(300)]
    telegram.user_says(contract.TELEGRAM_USERS["ann"], "Code:\n\n```python\n" + "\n".join(code_lines) + "\n```",
                       username="ann")
    wait_for(lambda: "299" in telegram.sent[-1]["text"], what="the long reply's last part")
    parts = [m for m in telegram.sent if m["chat"]["id"] == chat][1:]
    assert len(parts) == 2 and all(p["parse_mode"] == "HTML" for p in parts)
    assert [[(e["type"], e["language"]) for e in p["entities"]] for p in parts] == [[("pre", "python")]] * 2
    assert "\n".join(p["text"] for p in parts) == "echo: Code:\n\n" + "\n".join(code_lines)


def test_telegram_output_format_plain(daemon, telegram):  # noqa: F811
    reply_of("telegram", telegram, daemon, "**bold** & <b>tag</b> [x](https://a.test)",
             overrides={"output_format": "plain"})
    sent = telegram.sent[-1]
    assert sent["parse_mode"] is None and "entities" not in sent
    assert sent["text"] == "echo: bold & <b>tag</b> x (https://a.test)"


def test_matrix_gets_html_and_a_plain_body(daemon, matrix):  # noqa: F811
    room = reply_of("matrix", matrix, daemon, TRICKY)
    content = matrix.bot_contents(room)[-1]
    assert content["format"] == "org.matrix.custom.html" and content["msgtype"] == "m.text"
    assert content["formatted_body"] == (
        '<p>echo: Steps:</p><ol><li>Install with <code>pip install "a&lt;b"</code><ul><li>on <em>Linux</em>: '
        'use <strong>apt &amp; pip</strong></li></ul></li><li>Read '
        '<a href="https://example.com/d?a=1&amp;b=2">the docs</a></li></ol>'
        '<pre><code class="language-python">if a &lt; b:\n    print("&amp;amp;")\n</code></pre>')
    assert content["body"] == """echo: Steps:

1. Install with pip install "a<b"
   • on Linux: use apt & pip
2. Read the docs (https://example.com/d?a=1&b=2)

if a < b:
    print("&amp;")"""


def test_matrix_plain_sentences_and_output_format_markdown_send_no_html(daemon, matrix):  # noqa: F811
    room = reply_of("matrix", matrix, daemon, "just words & <more>")
    assert matrix.bot_contents(room)[-1] == {"msgtype": "m.text", "body": "echo: just words & <more>"}
    room = reply_of("matrix", matrix, daemon, "**bold** `x`", count=2, overrides={"output_format": "markdown"})
    assert matrix.bot_contents(room)[-1] == {"msgtype": "m.text", "body": "echo: **bold** `x`"}


def test_discord_mentions_never_ping_and_long_code_is_split_whole(daemon, discord):  # noqa: F811
    reply_of("discord", discord, daemon, "hey @everyone and @here, ask <@424242> about **this**")
    sent = discord.sent[-1]
    assert sent["content"] == "echo: hey @\u200beveryone and @\u200bhere, ask \\<\u200b@424242> about **this**"
    assert sent["allowed_mentions"] == {"parse": []}

    code = "\n".join(f"x{n} = '✅'  # 😀 line {n}" for n in range(120))
    discord.user_says("ann", f"Code:\n\n```py\n{code}\n```")
    wait_for(lambda: len(discord.replies("dm-ann")) >= 3 and "line 119" in discord.sent[-1]["content"],
             what="the long reply's parts")
    parts = [s["content"] for s in discord.sent[1:]]
    assert all(len(p.encode("utf-16-le")) // 2 <= 2000 for p in parts)
    assert parts[0].startswith("echo: Code:\n\n```py\nx0 = '✅'  # 😀 line 0\n") and len(parts) == 2
    assert all(p.count("```") == 2 and p.endswith("\n```") for p in parts)
    assert all(p.startswith("```py\n") for p in parts[1:])
    lines = [line for p in parts for line in p.split("\n") if line.startswith("x")]
    assert lines == code.split("\n")


def test_discord_long_reply_keeps_links_and_words_whole(daemon, discord):  # noqa: F811
    # The link does not fit the room the first paragraph leaves: it opens the next message,
    # its address with it, and no word is cut across two messages.
    para = " ".join(["word"] * 394)
    tail = " ".join(f"w{n}" for n in range(600))
    reply_of("discord", discord, daemon, f"{para}\n\n[link text here](https://example.com/x) {tail}", count=3)
    parts = [s["content"] for s in discord.sent]
    assert len(parts) == 3 and all(len(p.encode("utf-16-le")) // 2 <= 2000 for p in parts)
    assert parts[1].startswith("[link text here](<https://example.com/x>) w0 w1")
    assert " ".join(parts).split() == f"echo: {para} [link text here](<https://example.com/x>) {tail}".split()


@pytest.fixture(scope="module")
def ircd(tmp_path_factory):
    server = Ngircd(tmp_path_factory.mktemp("ircd")).start()
    yield server
    server.stop()


def test_irc_gets_plain_lines_cut_between_whole_characters(daemon, ircd):  # noqa: F811
    configure(daemon, "irc", server="127.0.0.1", port=ircd.port, nick="fmtbot", channels=[],
              default_agent="helper", send_interval_secs=0.05)
    wait_active(daemon, "irc")
    dave = IrcUser(ircd.port, "dave")
    try:
        dave.send("PRIVMSG fmtbot :**bold** `code` [docs](https://example.com/d) a<b & c")
        line = dave.wait(lambda l: l.startswith(":fmtbot!") and "PRIVMSG dave " in l)
        assert line.endswith("PRIVMSG dave :echo: bold code docs (https://example.com/d) a<b & c")
        # 3-byte characters across IRC's line limit (400 bytes falls inside the 133rd).
        dave.send("PRIVMSG fmtbot :xy" + "✅" * 145)
        got = [dave.wait(lambda l: l.startswith(":fmtbot!") and "PRIVMSG dave " in l).split(" :", 1)[1]
               for _ in range(3)]
        assert got == ["echo:", "xy" + "✅" * 132, "✅" * 13]
    finally:
        dave.close()
        daemon.delete("/api/channels/irc/configure")
