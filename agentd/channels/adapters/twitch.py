"""Twitch chat through its IRC gateway (irc.chat.twitch.tv:6667, or 6697 with TLS):
`PASS oauth:<token>`, `NICK`, `CAP REQ` for tags, `JOIN #channel`, PING/PONG, and
`PRIVMSG` in the channels listed. Messages addressed to the bot ("@nick ..." or
"nick: ...") are answered in the channel as "@user <answer>". The IRC adapter does
the protocol work and the splitting (lines of at most 400 UTF-8 bytes, well within
Twitch's 500 characters a message); this one adds Twitch's login and IRCv3 tags."""

from __future__ import annotations

from agentd.channels.adapter import ChannelError, Conversation
from agentd.channels.adapters.irc import IrcAdapter


class TwitchAdapter(IrcAdapter):
    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        settings = dict(settings)
        # Twitch channel names are the lower-case login with a leading '#'.
        settings["channels"] = ["#" + str(c).lower().lstrip("#") for c in settings.get("channels") or []]
        settings["nick"] = str(settings.get("nick") or "agentd").lower()
        super().__init__(ctx, settings)
        token = self.env("oauth_token_env")
        self.password = token if token.startswith("oauth:") else f"oauth:{token}"

    def on_connect(self) -> None:
        super().on_connect()  # PASS oauth:..., NICK, USER (Twitch ignores USER)
        self.send_line("CAP REQ :twitch.tv/tags twitch.tv/commands", urgent=True)

    def handle_line(self, line: str) -> None:
        if line.startswith("@"):  # IRCv3 tags (display-name, user-id...): not needed to answer
            line = line.partition(" ")[2]
        if " PRIVMSG " in line and line.split(" PRIVMSG ", 1)[1].startswith("#"):
            # "@nick hello" addresses the bot on Twitch: rewrite to the IRC adapter's "nick: hello".
            head, _, text = line.partition(" :")
            if text.lower().startswith("@" + self.current_nick.lower()):
                line = f"{head} :{self.current_nick}:{text[len(self.current_nick) + 1:]}"
        super().handle_line(line)

    def send(self, conversation: Conversation, text: str) -> str:
        if conversation.meta.get("addressee"):
            conversation.meta["addressee"] = "@" + conversation.meta["addressee"].lstrip("@")
        return super().send(conversation, text)

    def _privmsg(self, prefix: str, rest: str) -> None:
        if not rest.startswith("#"):
            return  # Twitch has no direct messages over IRC
        super()._privmsg(prefix, rest)

    def test_target(self, override: str = "") -> Conversation:
        target = override or next(iter(self.settings.get("channels") or []), "")
        if not target:
            raise ChannelError("no test target: set channels or pass chat_id (#channel)")
        return Conversation(self.name, "#" + target.lower().lstrip("#"))


ADAPTER = TwitchAdapter
