"""The reply formats (agentd/channels/format): one tricky reply written for each platform,
exactly as it is sent, and the splitter at each unit's limit."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from agentd.channels.format import TARGETS, measure, render
from agentd.channels.format.document import parse

TRICKY = """## Steps

1. Install with `pip install "a<b"`
   - on *Linux*: use **apt & pip**
     - nested [docs](https://example.com/d?a=1&b=2)
2. Done ~~maybe~~

Tom & Jerry <b>not bold</b> @everyone <@123456> @here

```python
if a < b and c > d:
    print("&amp;")
```"""


def only(text: str, target: str, limit: int = 10_000, unit: str = "chars") -> str:
    parts = render(text, target, limit, unit)
    assert len(parts) == 1, parts
    return parts[0].text


def test_slack_mrkdwn_escapes_the_three_control_characters():
    assert only(TRICKY, "slack") == """*Steps*

1. Install with `pip install "a&lt;b"`
   • on _Linux_: use *apt &amp; pip*
     • nested <https://example.com/d?a=1&amp;b=2|docs>
2. Done ~maybe~

Tom &amp; Jerry &lt;b&gt;not bold&lt;/b&gt; @everyone &lt;@123456&gt; @here

```
if a &lt; b and c &gt; d:
    print("&amp;amp;")
```"""
    assert only("<https://example.com>", "slack") == "<https://example.com>"
    assert only("[a|b](https://x.test/?q=a|b)", "slack") == "<https://x.test/?q=a%7Cb|a\u2223b>"


def test_telegram_html_uses_only_the_bot_api_tags():
    text = only(TRICKY, "telegram_html")
    assert text == """<b>Steps</b>

1. Install with <code>pip install "a&lt;b"</code>
   • on <i>Linux</i>: use <b>apt &amp; pip</b>
     • nested <a href="https://example.com/d?a=1&amp;b=2">docs</a>
2. Done <s>maybe</s>

Tom &amp; Jerry &lt;b&gt;not bold&lt;/b&gt; @everyone &lt;@123456&gt; @here

<pre><code class="language-python">if a &lt; b and c &gt; d:
    print("&amp;amp;")</code></pre>"""
    assert tags_of(text) <= {"b", "i", "s", "code", "pre", "a", "blockquote"}
    assert only("> one\n>\n> two", "telegram_html") == "<blockquote>one\n\ntwo</blockquote>"


def test_matrix_html_with_a_plain_body_of_the_same_part():
    [part] = render(TRICKY, "html", 10_000)
    assert part.text == (
        '<h2>Steps</h2><ol><li>Install with <code>pip install "a&lt;b"</code><ul><li>on <em>Linux</em>: '
        'use <strong>apt &amp; pip</strong><ul><li>nested <a href="https://example.com/d?a=1&amp;b=2">docs</a>'
        '</li></ul></li></ul></li><li>Done <del>maybe</del></li></ol>'
        '<p>Tom &amp; Jerry &lt;b&gt;not bold&lt;/b&gt; @everyone &lt;@123456&gt; @here</p>'
        '<pre><code class="language-python">if a &lt; b and c &gt; d:\n    print("&amp;amp;")\n</code></pre>')
    assert part.plain == """Steps

1. Install with pip install "a<b"
   • on Linux: use apt & pip
     • nested docs (https://example.com/d?a=1&b=2)
2. Done maybe

Tom & Jerry <b>not bold</b> @everyone <@123456> @here

if a < b and c > d:
    print("&amp;")"""
    balanced(part.text)
    assert render("- a\n\n  second\n- b", "html", 1000)[0].text == "<ul><li>a<br>second</li><li>b</li></ul>"
    assert render("3. c\n4. d", "html", 1000)[0].text == '<ol start="3"><li>c</li><li>d</li></ol>'
    assert render("one **line**", "html", 1000)[0].text == "one <strong>line</strong>"  # no <p>


def test_discord_markdown_neutralises_mentions():
    text = only(TRICKY, "discord")
    assert text == """## Steps

1. Install with `pip install "a<b"`
   - on *Linux*: use **apt & pip**
     - nested [docs](<https://example.com/d?a=1&b=2>)
2. Done ~~maybe~~

Tom & Jerry \\<b>not bold\\</b> @\u200beveryone \\<\u200b@123456> @\u200bhere

```python
if a < b and c > d:
    print("&amp;")
```"""
    # What Discord's parser reads back is the agent's text, minus the pings.
    assert "@everyone" not in text and "<@1" not in text and "@here" not in text
    assert only("`@everyone` in code", "discord") == "`@everyone` in code"


def test_plain_text_keeps_words_and_addresses():
    assert only(TRICKY, "plain") == """Steps

1. Install with pip install "a<b"
   • on Linux: use apt & pip
     • nested docs (https://example.com/d?a=1&b=2)
2. Done maybe

Tom & Jerry <b>not bold</b> @everyone <@123456> @here

if a < b and c > d:
    print("&amp;")"""
    assert only("see <https://a.test/x>", "plain") == "see https://a.test/x"


def test_whatsapp_markup():
    assert only("**b** _i_ ~~s~~ `c` [x](https://a.test)\n\n```\nx\n```", "whatsapp") == (
        "*b* _i_ ~s~ `c` x (https://a.test)\n\n```x```")


TABLE = "| h1 | h2 |\n|---|---|\n| [cell](https://cell.example/z) | **b** |\n| `x\\|y` | <https://a.test> |"

# A link or a style in a table's cell, as each format writes it in any other text.
TABLE_ROWS = {
    "slack": "*h1* | *h2*\n<https://cell.example/z|cell> | *b*\n`x|y` | <https://a.test>",
    "telegram_html": '<b>h1</b> | <b>h2</b>\n<a href="https://cell.example/z">cell</a> | <b>b</b>\n'
                     '<code>x|y</code> | <a href="https://a.test">https://a.test</a>',
    "html": '<strong>h1</strong> | <strong>h2</strong><br><a href="https://cell.example/z">cell</a> | '
            '<strong>b</strong><br><code>x|y</code> | <a href="https://a.test">https://a.test</a>',
    "discord": "**h1** | **h2**\n[cell](<https://cell.example/z>) | **b**\n`x|y` | <https://a.test>",
    "markdown": "**h1** | **h2**\n[cell](https://cell.example/z) | **b**\n`x|y` | <https://a.test>",
    "whatsapp": "*h1* | *h2*\ncell (https://cell.example/z) | *b*\n`x|y` | https://a.test",
    "plain": "h1 | h2\ncell (https://cell.example/z) | b\nx|y | https://a.test",
}


@pytest.mark.parametrize("target", TABLE_ROWS)
def test_a_table_is_a_line_a_row_whose_cells_keep_links_and_marks(target):
    assert only(TABLE, target) == TABLE_ROWS[target]


def test_slack_and_whatsapp_show_literal_markers_as_written():
    # Neither has an escape: a marker the text pairs up gets a word joiner on both sides,
    # one that could not pair stays as it is, and a style against a letter gets a
    # zero-width space at its edge.
    wj, zwsp = "\u2060", "\u200b"
    for target in ("slack", "whatsapp"):
        assert only(r"price \*not bold\* and \_not it\_ or \~not struck\~", target) == (
            f"price {wj}*{wj}not bold{wj}*{wj} and {wj}_{wj}not it{wj}_{wj} or {wj}~{wj}not struck{wj}~{wj}")
        assert only("2 * 3 = 6, snake_case_name, ~/bin and Foo_(bar)", target) == (
            "2 * 3 = 6, snake_case_name, ~/bin and Foo_(bar)")
        assert only(r"**5\* off** today", target) == f"*5{wj}*{wj} off* today"
        assert only("**foo**bar and foo**bar**", target) == f"*foo*{zwsp}bar and foo{zwsp}*bar*"
        assert only("`*code*` and **a** *b*", target) == "`*code*` and *a* _b_"


@pytest.mark.parametrize("source", [
    TRICKY,
    "- top\n  - child\n    1. one\n    2. two\n       - grand\n\n       more\n\n       ```sh\n       ls\n       ```\n- back",
    "10. ten\n11. eleven\n    - sub\n\n> quoted **text** `x`\n\n***\n\n# H [l](http://a.b/(x)) snake_case \\*lit\\*",
    "[helper] see [1], \\[a\\](b), \\[r\\]: x, [q\\]\\[z] and _e_ __s__ x_ _y a_b é_é [l](http://a.b) [",
])
def test_markdown_written_back_parses_to_the_same_reply(source):
    assert parse(only(source, "markdown")) == parse(source)
    assert parse(only(source, "discord").replace("\u200b", "")) == parse(source)


def test_markdown_escapes_only_what_would_be_read_as_markup():
    text = "[helper] see [1] in file_name.txt, not \\[a\\](b), *x* and 2\\*3 or _y"
    assert only(text, "markdown") == "[helper] see [1] in file_name.txt, not [a\\](b), *x* and 2\\*3 or \\_y"
    assert only(text, "discord") == "[helper] see [1] in file_name.txt, not [a\\](b), *x* and 2\\*3 or \\_y"
    # Discord reads "||" as a spoiler mark and "_" after a letter outside ASCII as emphasis.
    assert only("a || b || c and é_x_é", "discord") == "a \\|\\| b \\|\\| c and é\\_x\\_é"


def test_markdown_line_starts_keep_the_text_as_written():
    # CommonMark escapes punctuation only: the dot after a number takes the backslash.
    for target in ("markdown", "discord"):
        assert only("We shipped in\n2023. It went well.", target) == "We shipped in\n2023\\. It went well."
        assert only("1\\. not ordered", target) == "1\\. not ordered"
        assert only("1\\) nor this", target) == "1\\) nor this"
        assert only("a\n\\---", target) == "a\n\\---"  # not a heading's underline
        for source in ("We shipped in\n2023. It went well.", "1\\) x", "a\n\\---", "a\n\\=", "a\n\\-- -"):
            assert parse(only(source, target)) == parse(source), source


# -- splitting -----------------------------------------------------------------------------

def test_a_long_code_block_is_closed_and_reopened_with_its_language():
    code = "\n".join(f"line_{n} = {n}" for n in range(40))
    reply = f"Intro.\n\n```python\n{code}\n```\n\nAfter."
    for target, opener, closer in (("markdown", "```python\n", "\n```"), ("slack", "```\n", "\n```"),
                                   ("telegram_html", '<pre><code class="language-python">', "</code></pre>")):
        parts = [p.text for p in render(reply, target, 120)]
        assert len(parts) > 3 and all(len(p) <= 120 for p in parts)
        middle = [p for p in parts if "line_" in p]
        assert all(opener in p and closer in p for p in middle), middle
        inside = [p.split(opener, 1)[1].split(closer, 1)[0] for p in middle]
        assert "\n".join(inside) == code  # every line once, in order, none cut


def test_a_link_is_never_cut():
    reply = "word " * 30 + "[the link text](https://example.com/a/b?c=d) " + "word " * 30
    for target in ("slack", "telegram_html", "markdown", "plain"):
        parts = [p.text for p in render(reply, target, 100)]
        assert all(len(p) <= 100 for p in parts)
        assert sum("the link text" in p for p in parts) == 1, parts
        assert sum("https://example.com/a/b?c=d" in p for p in parts) == 1, parts


@pytest.mark.parametrize("unit,limit", [("bytes", 40), ("utf16", 17), ("chars", 13)])
def test_three_byte_emoji_at_the_split_point(unit, limit):
    # "✅" and "€" are three UTF-8 bytes, "😀" four (two UTF-16 units): the limit falls inside them.
    word = "ab✅€😀" * 20
    parts = [p.text for p in render(word, "plain", limit, unit)]
    assert all(measure(p, unit) <= limit for p in parts)
    assert "".join(parts) == word
    for part in parts:
        part.encode("utf-8").decode("utf-8")  # whole characters only
        assert part.encode("utf-16-le").decode("utf-16-le") == part


def test_an_emoji_sequence_stays_whole():
    family = "👩\u200d👩\u200d👧"  # one picture, five code points
    flag = "🇫🇷"
    text = ("x" * 5 + family + flag) * 4
    parts = [p.text for p in render(text, "plain", 9)]
    assert "".join(parts) == text
    for part in parts:
        assert not part.startswith("\u200d") and not part.endswith("\u200d")
        assert part.count("🇫") == part.count("🇷")


def test_words_go_whole_into_parts_under_the_limit():
    reply = " ".join(f"w{n:03d}" for n in range(200))
    parts = [p.text for p in render(reply, "slack", 50)]
    assert all(len(p) <= 50 for p in parts)
    assert " ".join(parts).split() == reply.split()
    assert render("short", "slack", 4000)[0].text == "short"
    assert render("  \n ", "slack", 4000) == []


def test_a_link_that_fits_a_part_goes_whole_to_the_next():
    # The link does not fit the room the first paragraph leaves: it starts the next part.
    reply = "aaaa bbbb cccc dddd\n\n[link text here](https://example.com/x) tail words here"
    for target in TARGETS:
        limit = measure(only("[link text here](https://example.com/x)", target), "chars") + 3
        parts = [p.text for p in render(reply, target, limit)]
        assert all(len(p) <= limit for p in parts), (target, parts)
        [linked] = [p for p in parts if "link text" in p]
        assert "link text here" in linked and "https://example.com/x" in linked, (target, parts)
    assert [p.text for p in render(reply, "plain", 40)] == [
        "aaaa bbbb cccc dddd", "link text here (https://example.com/x)", "tail words here"]


def test_a_word_or_code_line_is_cut_only_when_longer_than_a_part():
    para = " ".join(["word"] * 397)  # leaves room for part of the next word
    reply = para + "\n\nExtraordinarily " + " ".join(["word"] * 500)  # longer than a part
    parts = [p.text for p in render(reply, "discord", 2000)]
    assert [w for p in parts for w in p.split()] == reply.split()
    assert parts[1].startswith("Extraordinarily word")

    code = "\n".join(f"result_{n} = compute_something(alpha, beta)" for n in range(80))
    para = " ".join(["word"] * 395)  # leaves room for the fences and part of a line
    parts = [p.text for p in render(para + "\n\n```python\n" + code + "\n```", "discord", 2000)]
    assert all(len(p) <= 2000 and p.count("```") in (0, 2) for p in parts)
    assert [line for p in parts for line in p.split("\n") if line.startswith("result_")] == code.split("\n")

    # In a list, the next part goes on at the margin, the word whole.
    assert [p.text for p in render("- aaaa bbbb\n- extraordinary words follow here", "plain", 20)] == [
        "• aaaa bbbb", "• extraordinary", "words follow here"]
    parts = [p.text for p in render("- a\n  - aaaa bbbb cccc dddd eeee ffff", "markdown", 16)]
    assert parts == ["- a\n  - aaaa", "bbbb cccc dddd", "eeee ffff"]  # four spaces would be code
    # A word longer than a part is still cut, between characters.
    assert [p.text for p in render("ab " + "x" * 30, "plain", 12)] == ["ab", "x" * 12, "x" * 12, "x" * 6]


def test_matrix_parts_count_body_and_html_together():
    reply = "\n\n".join(f"paragraph **{n}** & more text here" for n in range(30))
    parts = render(reply, "html", 300, "bytes", both=True)
    assert len(parts) > 1
    for part in parts:
        assert measure(part.text, "bytes") + measure(part.plain, "bytes") <= 300
        balanced(part.text)
    assert [t for p in parts for t in p.plain.split("\n\n")] == [
        f"paragraph {n} & more text here" for n in range(30)]


def test_every_target_renders_every_kind_of_block():
    reply = TRICKY + "\n\n> quote\n\n---\n\n| a | b |\n|---|---|\n| 1 | 22 |\n\n![alt](https://i.test/x.png)"
    for name in TARGETS:
        text = only(reply, name)
        assert "22" in text and "alt" in text, name


def tags_of(text: str) -> set[str]:
    found: set[str] = set()

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
            found.add(tag)

    Tags().feed(text)
    return found


def balanced(text: str) -> None:
    stack: list[str] = []

    class Check(HTMLParser):
        def handle_starttag(self, tag, attrs):  # type: ignore[no-untyped-def]
            if tag not in ("br", "hr"):
                stack.append(tag)

        def handle_endtag(self, tag):  # type: ignore[no-untyped-def]
            assert stack and stack.pop() == tag, (tag, text)

    Check().feed(text)
    assert not stack, text


def test_output_format_picks_the_format_per_channel():
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.adapters.slack import SlackSocketAdapter
    from agentd.channels.adapters.telegram import TelegramAdapter

    def adapter(cls, **overrides):  # type: ignore[no-untyped-def]
        ctx = ChannelContext("x", "127.0.0.1", deliver=lambda m: None, audit=lambda *a: None,
                             load_state=dict, save_state=lambda s: None)
        return cls(ctx, {"overrides": overrides} if overrides else {})

    reply = "**x** & y"
    assert [(p.text, p.format) for p in adapter(TelegramAdapter).format_reply(reply)] == [
        ("<b>x</b> &amp; y", "telegram_html")]
    for name, expected in (("native", ("<b>x</b> &amp; y", "telegram_html")), ("plain", ("x & y", "plain")),
                           ("plain_text", ("x & y", "plain")), ("markdown", ("**x** & y", "markdown")),
                           ("slack_mrkdwn", ("*x* &amp; y", "slack"))):
        assert [(p.text, p.format) for p in adapter(TelegramAdapter, output_format=name).format_reply(reply)] == [
            expected], name
    assert adapter(SlackSocketAdapter).reply_texts(reply) == ["*x* &amp; y"]
