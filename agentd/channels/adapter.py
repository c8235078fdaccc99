"""The adapter seam: what every channel adapter implements and what the runtime gives it.

Adapters are synchronous like the rest of agentd: `start()` spawns the adapter's own
threads (never waitress request threads) and returns; `stop()` ends them. Inbound
messages go to `ctx.deliver(...)`, which never blocks the reader.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from agentd.channels.conversation import key_of
from agentd.channels.format import CHARS, Part, render, target_for


@dataclass
class Conversation:
    """Where a message came from and where the reply goes.

    `chat_id` is the platform's chat/room/channel (for a direct message: the
    user's own address on that platform); `meta` carries what a reply needs
    (thread ids, email headers...).
    """

    channel: str
    chat_id: str
    user_id: str = ""
    direct: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    # The thread the message is in and the reply goes to ("": none): a conversation of its own.
    thread_id: str = ""
    # A group whose `group_policy` is `shared`: one session for all its senders.
    shared: bool = False

    @property
    def key(self) -> str:
        """One session per key (agentd/channels/conversation.py): platform + chat + thread,
        plus the sender unless the group is shared."""
        return key_of(self.channel, self.chat_id, self.user_id, self.direct, self.thread_id, self.shared)


@dataclass
class Inbound:
    """One message from a platform user."""

    conversation: Conversation
    sender_id: str
    text: str
    message_id: str = ""
    sender_name: str = ""
    # Other names the sender is known by (username next to a numeric id...), for allow-lists.
    sender_aliases: tuple[str, ...] = ()
    # Spaces the chat belongs to (a Discord guild, a Guilded server...), matched by the
    # chat allow-lists too (`allowed_guilds` names guilds, not channels).
    chat_aliases: tuple[str, ...] = ()
    # A press of a button agentd posted (an approval's Approve/Reject): what the adapter
    # needs to answer the platform's interaction (ids, tokens); empty for typed messages.
    interaction: dict[str, Any] = field(default_factory=dict)
    # The user changed an earlier message: `text` is its new text.
    edited: bool = False
    # The bot was mentioned or replied to (adapters of conversation.MENTION_ADAPTERS say so).
    mentioned: bool = False
    # A group message the adapter's own rule answers when `group_policy` is unset (it mentions
    # or replies to the bot, or is in a thread the bot follows); other group messages are
    # delivered too, and answered only under `respond` / `shared`.
    addressed: bool = True
    # An agent the adapter routes this message to (telegram `thread_routes`), by name.
    agent: str = ""
    # Files and images sent with the message (agentd/channels/attachments.py fetches them).
    attachments: list[Any] = field(default_factory=list)


class ChannelError(Exception):
    """A platform call failed (the message says which and why)."""


class Unreachable(ChannelError):
    """The platform did not answer (no connection, or 429/5xx until the retries ran out):
    the same call may well work later."""


class ChannelContext:
    """What the runtime hands an adapter: delivery, audit, persisted state, settings."""

    def __init__(self, name: str, listen_host: str,
                 deliver: Callable[[Inbound], None],
                 audit: Callable[..., None],
                 load_state: Callable[[], dict[str, Any]],
                 save_state: Callable[[dict[str, Any]], None],
                 configured: frozenset[str] | None = None,
                 store_secrets: Callable[[dict[str, str]], None] | None = None) -> None:
        self.name = name
        # The keys the adapter's `[channels.<name>]` section sets (None: an adapter made
        # outside the runtime). A webhook adapter opens its own port only when its section
        # names one (agentd/channels/bases/webhook.py).
        self.configured = configured
        self.listen_host = listen_host
        self.deliver = deliver
        self._audit = audit
        self.load_state = load_state
        self.save_state = save_state
        # A credential the platform itself replaced (a rotated refresh token): written where
        # the configure API writes secrets (secrets.env and the environment), never the database.
        self.store_secrets = store_secrets
        self.log = logging.getLogger(f"agentd.channels.{name}")
        # `[api] trusted_proxies`: a webhook listener behind one of them records the
        # real sender, not the proxy (`client_of(peer, header)`, the runtime's).
        self.client_of: Callable[[str, Callable[[str], str | None]], str] = lambda peer, header: peer

    def audit(self, event: str, **detail: Any) -> None:
        """Write a `channel.<event>` entry for this adapter to the audit trail."""
        self._audit(f"channel.{event}", self.name, detail)


class Adapter:
    """Base class of every adapter (subclass one of the bases in `bases/`)."""

    #: the platform's maximum message length (longer replies are split into several)
    max_message_len = 4000
    #: what `max_message_len` counts: "chars" (code points), "utf16" (UTF-16 code units)
    #: or "bytes" (UTF-8)
    limit_unit = CHARS
    #: the text format the platform draws (a target of agentd/channels/format); "" sends the
    #: agent's text as written, unsplit
    text_format = "markdown"
    #: keys whose values must be set (env var names resolved) before start()
    required_env: tuple[str, ...] = ()

    def __init__(self, ctx: ChannelContext, settings: dict[str, Any]) -> None:
        self.ctx = ctx
        self.settings = settings
        self.name = ctx.name
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- helpers for subclasses -------------------------------------------------
    def env(self, key: str, required: bool = True) -> str:
        """The value of the environment variable named by setting `key` (a `*_env` key)."""
        var = self.settings.get(key) or ""
        value = os.environ.get(var, "") if var else ""
        if required and not value:
            raise ChannelError(f"environment variable {var or '(unset ' + key + ')'} is not set")
        return value

    def spawn(self, target: Callable[[], None], role: str) -> threading.Thread:
        """Start a daemon thread named `channel-<name>-<role>`; stop() joins it."""
        thread = threading.Thread(target=self._guard(target), name=f"channel-{self.name}-{role}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # noqa: BLE001 - an adapter thread must never die silently
                self.ctx.log.exception("adapter thread failed")
                self.ctx.audit("error", error=f"{type(exc).__name__}: {exc}")
        return run

    # -- the seam -------------------------------------------------------------------
    def start(self) -> None:
        """Connect and start the adapter's own threads; returns at once."""
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every thread to end, close connections, join the threads."""
        self.stopping.set()
        self.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def close(self) -> None:
        """Break blocking reads so threads notice `stopping` (sockets, streams)."""

    def send(self, conversation: Conversation, text: str) -> str:
        """Deliver `text` to the conversation; returns the platform's message id (or "")."""
        raise NotImplementedError

    def format_reply(self, text: str, limit: int | None = None, both: bool = False) -> list[Part]:
        """`text` (the agent's Markdown) in this channel's format (`overrides.output_format`,
        else the platform's own), in parts that each fit `limit` (`max_message_len`)."""
        chosen = (self.settings.get("overrides") or {}).get("output_format")
        target = target_for(self.text_format, chosen)
        if not target:
            return [Part(text, text, "")] if text.strip() else []
        return render(text, target, limit or self.max_message_len, self.limit_unit, both=both)

    def reply_texts(self, text: str, limit: int | None = None) -> list[str]:
        """The parts of `format_reply`, as the strings to send."""
        return [part.text for part in self.format_reply(text, limit)]

    def send_typing(self, conversation: Conversation) -> None:
        """Show a typing indicator where the platform has one."""

    def react(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        """Put the bot's reaction `emoji` on a user's message (platforms with reactions)."""

    def unreact(self, conversation: Conversation, message_id: str, emoji: str) -> None:
        """Take the bot's reaction `emoji` off a user's message again, where the platform can."""

    def send_approval(self, conversation: Conversation, approval_id: str, text: str) -> str:
        """Ask for an approval in the conversation: `text` describes the tool call.
        Platforms with buttons override this to post Approve/Reject buttons whose press
        comes back as an Inbound `/approve <id>` or `/reject <id>` with `interaction` set;
        elsewhere the request says which reply to type."""
        return self.send(conversation, f"{text}\nReply /approve {approval_id} or /reject {approval_id}.")

    def settle_approval(self, conversation: Conversation, request_id: str, text: str) -> None:
        """An approval asked in the conversation was decided elsewhere (the dashboard, the API)
        or timed out: `text` says so. Platforms with buttons replace the request (message
        `request_id`) so its buttons go; elsewhere it is a new message."""
        self.send(conversation, text)

    def answer_interaction(self, msg: Inbound, text: str, final: bool) -> bool:
        """Answer a button press (`msg.interaction`): `final` when it decided the approval
        (the buttons go), else a refusal or error meant for the presser alone. True when the
        answer is visible in the conversation, so nothing more needs posting there."""
        return False

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        """Post a file (an image shown as one where the platform can) to the conversation."""
        raise ChannelError(f"{self.name}: this adapter does not send files")

    def file_hosts(self) -> set[str]:
        """Hosts (`host` or `host:port`; `.domain` for any host under it) inbound files may be
        fetched from: the platform's own."""
        return set()

    def health(self) -> bool:
        """True while the adapter is connected and working."""
        return False

    def test_target(self, override: str = "") -> Conversation:
        """Where `POST /api/channels/{name}/test` sends (`override` from the request)."""
        raise ChannelError("this adapter has no test target; pass chat_id in the request")

    def threads_alive(self) -> int:
        return sum(1 for t in self._threads if t.is_alive())
