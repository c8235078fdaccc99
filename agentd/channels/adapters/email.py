"""Email: IMAP polling for new mail (UIDs tracked and persisted with UIDVALIDITY, so
a message is answered once even across restarts), SMTP replies threaded with
In-Reply-To/References. `imap_security`/`smtp_security`: tls, starttls or none.

An email thread is a conversation of its own: its root is the first Message-ID of
`References` (else `In-Reply-To`), which every reply in the chain carries; a mail without
either starts a thread, unless its subject says it is a reply ("Re: ..."), when the
subject (without the Re:/Fwd: prefixes) names the thread.

Files: a mail's attachments travel in the message itself (no download); files go out as
attachments of a threaded reply."""

from __future__ import annotations

import email
import email.policy
import imaplib
import re
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import make_msgid, parseaddr

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment
from agentd.channels.bases.polling import PollingAdapter


class EmailAdapter(PollingAdapter):
    max_message_len = 100_000
    text_format = "plain"

    def prepare(self) -> None:
        self.password = self.env("password_env")
        self.username = str(self.settings.get("username") or "")
        self.address = str(self.settings.get("from_address") or self.username)
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 30)

    def _imap(self) -> imaplib.IMAP4:
        host, port = str(self.settings.get("imap_host")), int(self.settings.get("imap_port") or 993)
        security = self.settings.get("imap_security") or "tls"
        if security == "tls":
            conn: imaplib.IMAP4 = imaplib.IMAP4_SSL(host, port, timeout=30)
        else:
            conn = imaplib.IMAP4(host, port, timeout=30)
            if security == "starttls":
                conn.starttls(ssl.create_default_context())
        conn.login(self.username, self.password)
        return conn

    def poll_once(self) -> None:
        conn = self._imap()
        try:
            for folder in self.settings.get("folders") or ["INBOX"]:
                self._poll_folder(conn, folder)
        finally:
            try:
                conn.logout()
            except (imaplib.IMAP4.error, OSError):
                pass

    def _poll_folder(self, conn: imaplib.IMAP4, folder: str) -> None:
        status, _ = conn.select(folder)
        if status != "OK":
            raise ChannelError(f"cannot select folder {folder}")
        validity = (conn.response("UIDVALIDITY")[1] or [b""])[0]
        validity = validity.decode() if isinstance(validity, bytes) else str(validity or "")
        cursor = self.state.get(folder) or {}
        if cursor.get("validity") != validity:  # new mailbox (or first run): answer unread mail
            cursor = {"validity": validity, "last_uid": 0}
            _, data = conn.uid("SEARCH", None, "UNSEEN")
        else:
            _, data = conn.uid("SEARCH", None, f"UID {cursor['last_uid'] + 1}:*")
        uids = sorted(int(u) for u in (data[0] or b"").split() if int(u) > cursor["last_uid"])
        for uid in uids:
            _, parts = conn.uid("FETCH", str(uid), "(RFC822)")
            raw = next((p[1] for p in parts if isinstance(p, tuple)), None)
            # Persist before answering: a crash must not make us answer twice.
            cursor["last_uid"] = uid
            self.save_cursor(**{folder: dict(cursor)})
            conn.uid("STORE", str(uid), "+FLAGS", "(\\Seen)")
            if raw:
                self._handle(email.message_from_bytes(raw, policy=email.policy.default))
        if not uids:
            self.save_cursor(**{folder: dict(cursor)})

    def _handle(self, msg: email.message.EmailMessage) -> None:
        sender = parseaddr(str(msg.get("Reply-To") or msg.get("From") or ""))[1].lower()
        auto = str(msg.get("Auto-Submitted") or "no").lower()
        if not sender or sender == self.address.lower() or auto != "no" or sender.startswith("mailer-daemon"):
            return  # our own mail, bounces and auto-replies are never answered (no mail loops)
        body = msg.get_body(preferencelist=("plain", "html"))
        text = body.get_content() if body is not None else ""
        if body is not None and body.get_content_type() == "text/html":
            text = _html_text(text)  # HTML-only mail: the words, not the markup
        lines = []
        for line in text.splitlines():
            if line.strip() == "--":
                break  # signature
            if not line.startswith(">"):
                lines.append(line)
        text = "\n".join(lines).strip()
        files = [Attachment(part.get_filename() or "attachment", part.get_content_type(),
                            data=part.get_payload(decode=True) or b"") for part in msg.iter_attachments()]
        if not text and not files:
            return
        message_id = str(msg.get("Message-ID") or "").strip()
        meta = {"subject": str(msg.get("Subject") or ""), "message_id": message_id,
                "references": str(msg.get("References") or "").strip()}
        conversation = Conversation(self.name, sender, sender, direct=True, meta=meta,
                                    thread_id=thread_of(msg, message_id))
        self.ctx.deliver(Inbound(conversation, sender_id=sender, text=text, message_id=message_id,
                                 sender_name=parseaddr(str(msg.get("From") or ""))[0] or sender,
                                 attachments=files))

    def send(self, conversation: Conversation, text: str) -> str:
        msg = self._reply(conversation, text)
        self._smtp_send(msg)
        return str(msg["Message-ID"])

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        msg = self._reply(conversation, f"{filename} is attached.")
        maintype, _, subtype = content_type.partition("/")
        msg.add_attachment(data, maintype=maintype or "application", subtype=subtype or "octet-stream",
                           filename=filename)
        self._smtp_send(msg)
        return str(msg["Message-ID"])

    def _reply(self, conversation: Conversation, text: str) -> EmailMessage:
        if not hasattr(self, "password"):
            self.prepare()
        meta = conversation.meta
        msg = EmailMessage()
        msg["From"] = self.address
        msg["To"] = conversation.chat_id
        subject = meta.get("subject") or "Message from agentd"
        msg["Subject"] = subject if subject.lower().startswith("re:") or not meta.get("message_id") else f"Re: {subject}"
        domain = self.address.rpartition("@")[2] or "agentd.local"
        msg["Message-ID"] = make_msgid(domain=domain)
        if meta.get("message_id"):
            msg["In-Reply-To"] = meta["message_id"]
            msg["References"] = " ".join(p for p in (meta.get("references"), meta["message_id"]) if p)
        msg["Auto-Submitted"] = "auto-replied"
        msg.set_content("\n\n".join(self.reply_texts(text)))
        return msg

    def _smtp_send(self, msg: EmailMessage) -> None:
        host, port = str(self.settings.get("smtp_host")), int(self.settings.get("smtp_port") or 587)
        security = self.settings.get("smtp_security") or "starttls"
        try:
            smtp = (smtplib.SMTP_SSL(host, port, timeout=30) if security == "tls"
                    else smtplib.SMTP(host, port, timeout=30))
            with smtp:
                if security == "starttls":
                    smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
                if smtp.has_extn("auth"):
                    smtp.login(self.username, self.password)
                smtp.send_message(msg)
        except (smtplib.SMTPException, OSError) as exc:
            raise ChannelError(f"SMTP {host}:{port}: {exc}") from None

    def test_target(self, override: str = "") -> Conversation:
        target = override or str(self.settings.get("test_recipient") or "") or self.username
        if "@" not in target:
            raise ChannelError("no test target: set test_recipient or pass chat_id (an address)")
        return Conversation(self.name, target, target, direct=True)


REPLY_PREFIX = re.compile(r"^\s*((re|fwd?|aw|sv|antw)\s*(\[\d+\])?\s*:\s*)+", re.IGNORECASE)


def thread_of(msg: email.message.EmailMessage, message_id: str) -> str:
    """The thread a mail belongs to: the root Message-ID of its chain (see the module doc)."""
    chain = re.findall(r"<[^<>\s]+>", str(msg.get("References") or "")) or \
        re.findall(r"<[^<>\s]+>", str(msg.get("In-Reply-To") or ""))
    if chain:
        return chain[0]
    subject = str(msg.get("Subject") or "")
    if REPLY_PREFIX.match(subject):
        return "subject:" + " ".join(REPLY_PREFIX.sub("", subject).split()).lower()
    return message_id


def _html_text(html: str) -> str:
    from html.parser import HTMLParser

    parts: list[str] = []

    class Text(HTMLParser):
        def handle_data(self, data: str) -> None:
            parts.append(data)

        def handle_starttag(self, tag: str, attrs: object) -> None:
            if tag in ("br", "p", "div", "li"):
                parts.append("\n")

    Text().feed(html)
    return "".join(parts)


ADAPTER = EmailAdapter
