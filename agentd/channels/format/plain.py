"""Plain text: for platforms that show text as it is (IRC, XMPP, SMS-like services)."""

from __future__ import annotations

from agentd.channels.format.layout import LineTarget


class Plain(LineTarget):
    name = "plain"

    def link(self, label: str, raw: str, href: str) -> str:
        # An autolink or a bare URL says it already; otherwise the address follows the text.
        if raw.strip() in (href, href.removeprefix("mailto:")):
            return label
        return f"{label} ({href})"
