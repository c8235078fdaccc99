"""HTML: Matrix `org.matrix.custom.html` (the subset the spec recommends clients draw),
sent as `formatted_body` beside a plain-text `body` of the same part; Mumble draws it too."""

from __future__ import annotations

import html

from agentd.channels.format.document import EM, STRIKE, STRONG, Block
from agentd.channels.format.layout import LineTarget



class MatrixHtml(LineTarget):
    name = "html"
    wraps = {STRONG: ("<strong>", "</strong>"), EM: ("<em>", "</em>"), STRIKE: ("<del>", "</del>")}

    def escape(self, text: str) -> str:
        return html.escape(text, quote=False)

    def line_break(self) -> str:
        return "<br>"

    def inline_code(self, text: str) -> str:
        return f"<code>{self.escape(text)}</code>"

    def link(self, label: str, raw: str, href: str) -> str:
        return f'<a href="{html.escape(href, quote=True)}">{label}</a>'

    def content(self, block: Block) -> str:
        if block.kind == "code":
            lang = f' class="language-{html.escape(block.lang, quote=True)}"' if block.lang else ""
            return f"<pre><code{lang}>{self.escape(block.code)}\n</code></pre>"
        if block.kind == "rule":
            return "<hr>"
        if block.kind == "heading":
            return f"<h{block.level}>{self.spans(block.spans)}</h{block.level}>"
        body = self.spans(block.spans)
        return body if block.lists else f"<p>{body}</p>"

    def render(self, blocks: list[Block]) -> str:
        if len(blocks) == 1 and blocks[0].kind == "para" and not (blocks[0].lists or blocks[0].quote):
            return self.spans(blocks[0].spans)  # one paragraph: no <p>, as clients send it
        out: list[str] = []
        depth = 0  # quote depth open in `out`
        stack: list[str] = []  # open list tags, each with an open <li>
        for block in blocks:
            if block.quote != depth:
                out.append(self._close_lists(stack))
                while depth > block.quote:
                    out.append("</blockquote>")
                    depth -= 1
                while depth < block.quote:
                    out.append("<blockquote>")
                    depth += 1
            tags = ["ol" if level.ordered else "ul" for level in block.lists]
            keep = 0
            while keep < min(len(stack), len(tags)) and stack[keep] == tags[keep]:
                keep += 1
            while len(stack) > keep:
                out.append(f"</li></{stack.pop()}>")
            if tags and keep == len(tags):
                # The same list: a new item after the one before, or more of the same item.
                out.append("</li><li>" if block.item else "<br>")
            for number, tag in enumerate(tags[keep:], start=keep):
                start = block.lists[number].number
                out.append(f'<ol start="{start}"><li>' if tag == "ol" and start != 1 else f"<{tag}><li>")
                stack.append(tag)
            out.append(self.content(block))
        out.append(self._close_lists(stack))
        out.append("</blockquote>" * depth)
        return "".join(out)

    @staticmethod
    def _close_lists(stack: list[str]) -> str:
        closing = "".join(f"</li></{tag}>" for tag in reversed(stack))
        stack.clear()
        return closing
