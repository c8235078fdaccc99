"""IRC: a TCP (optionally TLS) client speaking RFC 1459/2812 lines.

Registers with PASS/NICK/USER, answers PING, joins `channels` after the welcome
(001), answers direct messages and channel messages addressed to its nick
("nick: question"). Replies are split into lines that fit IRC's 512-byte limit and
paced by the line-socket base (flood-safe).
"""

from __future__ import annotations

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.line_socket import LineSocketAdapter

LINE_BYTES = 400  # 512 minus the prefix the server prepends when relaying


class IrcAdapter(LineSocketAdapter):
    max_message_len = LINE_BYTES
    limit_unit = "bytes"
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.nick = str(settings.get("nick") or "agentd")
        self.current_nick = self.nick
        self.send_interval = float(settings.get("send_interval_secs") or 0.5)
        self.password = self.env("password_env", required=False) if settings.get("password_env") else ""

    def address(self) -> tuple[str, int, bool, bool]:
        port = int(self.settings.get("port") or 6667)
        return (str(self.settings.get("server")), port, bool(self.settings.get("use_tls")),
                bool(self.settings.get("tls_verify", True)))

    def on_connect(self) -> None:
        self.current_nick = self.nick
        if self.password:
            self.send_line(f"PASS {self.password}", urgent=True)
        self.send_line(f"NICK {self.nick}", urgent=True)
        self.send_line(f"USER {self.nick} 0 * :agentd", urgent=True)

    def handle_line(self, line: str) -> None:
        prefix = ""
        if line.startswith(":"):
            prefix, _, line = line[1:].partition(" ")
        command, _, rest = line.partition(" ")
        command = command.upper()
        if command == "PING":
            self.send_line(f"PONG {rest}", urgent=True)
        elif command == "001":
            self.current_nick = rest.split(" ", 1)[0] or self.current_nick
            self.healthy = True
            for channel in self.settings.get("channels") or []:
                self.send_line(f"JOIN {channel}", urgent=True)
        elif command in ("433", "436"):  # nick in use: try another
            self.current_nick += "_"
            self.send_line(f"NICK {self.current_nick}", urgent=True)
        elif command == "PRIVMSG":
            self._privmsg(prefix, rest)

    def _privmsg(self, prefix: str, rest: str) -> None:
        target, _, text = rest.partition(" ")
        text = text[1:] if text.startswith(":") else text
        sender = prefix.split("!", 1)[0]
        if not sender or text.startswith("\x01"):  # CTCP (ACTION, VERSION...) is not a message
            return
        if target.lower() == self.current_nick.lower():
            conversation = Conversation(self.name, sender, sender, direct=True)
            mentioned = self.current_nick.lower() in text.lower()
        else:  # a channel message is addressed when it starts "nick: ..."
            mentioned = any(text.lower().startswith(self.current_nick.lower() + mark) for mark in (":", ",", " "))
            if mentioned:
                text = text[len(self.current_nick) + 1:].strip()
            conversation = Conversation(self.name, target, sender, meta={"addressee": sender})
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text, sender_name=sender,
                                 message_id=f"{target}:{sender}:{abs(hash(text)) % 10**8}", mentioned=mentioned,
                                 addressed=mentioned or conversation.direct))

    def send(self, conversation: Conversation, text: str) -> str:
        if self.sock is None:
            raise ChannelError("not connected to the IRC server")
        prefix = f"{conversation.meta['addressee']}: " if conversation.meta.get("addressee") else ""
        count = 0
        # Every line is its own PRIVMSG, so a part that fits the limit has lines that do.
        for part in self.reply_texts(text, LINE_BYTES - len(prefix.encode())):
            for line in part.splitlines():
                if line.strip():
                    self.send_line(f"PRIVMSG {conversation.chat_id} :{prefix}{line}")
                    count += 1
        self.flush()  # "sent" means written to the server, not just queued
        return f"{conversation.chat_id}:{count}"

    def close(self) -> None:
        if self.sock is not None:
            try:  # a polite QUIT so the server tells the channels why we left
                self.send_line("QUIT :agentd channel stopped", urgent=True)
            except OSError:
                pass
        super().close()

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("channels") or []), "")
        if not target:
            raise ChannelError("no test target: set channels or pass chat_id (a nick or #channel)")
        return Conversation(self.name, target)


ADAPTER = IrcAdapter
