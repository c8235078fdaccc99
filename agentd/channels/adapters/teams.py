"""Microsoft Teams through the Bot Framework: activities POSTed to the adapter's own
listener with `Authorization: Bearer <JWT>`, verified before use: RS256 signature by a key
of the Bot Framework's OpenID configuration (`openid_url` → jwks_uri, cached, refetched
on an unknown key id) that endorses the activity's channel, issuer
https://api.botframework.com, audience `app_id`, expiry (5 minutes of clock skew), and the
`serviceUrl` claim equal to the activity's serviceUrl. Replies: an OAuth2
client-credentials token (cached until expiry), then
POST {serviceUrl}/v3/conversations/{conversationId}/activities/{activityId}; typing is a
`typing` activity. Approvals are Adaptive Cards with two Action.Submit buttons; a press
arrives as a message activity whose `value` holds the button's data (and `replyToId` the
card), and the decided card is replaced by its outcome (PUT .../activities/{cardId}).

Files: a message's `attachments` of type `image/*` (inline images, `contentUrl` on the Bot
Connector's attachment store, fetched with the bot's token) and
`application/vnd.microsoft.teams.file.download.info` (a file of a personal chat: the
pre-authenticated `content.downloadUrl` on SharePoint, fetched without credentials). Only
the hosts Teams uses for them are fetched from: the activity's verified `serviceUrl`,
smba.trafficmanager.net, botapi.skype.com, `*.asm.skype.com` and `*.sharepoint.com` (a
host under those two is allowed once a verified activity names it). Images go out inline,
as an attachment whose `contentUrl` is a base64 `data:` URI (PNG, JPEG or GIF, up to 1 MB,
as the Bot Framework documents for Teams). Any other file goes to a personal chat through
the FileConsentCard flow: a `file.consent` card asks the user; their Allow arrives as a
`fileConsent/invoke` activity whose `uploadInfo.uploadUrl` (on SharePoint) takes the bytes
(PUT with `Content-Range`), then a `file.info` card shows the file. Teams gives a bot no
way to post a file in a channel or group chat, so there it is refused (audited).

Docs: https://learn.microsoft.com/azure/bot-service/rest-api/bot-framework-rest-connector-authentication
and .../bot-framework-rest-connector-send-and-receive-messages
"""

from __future__ import annotations

import base64
import re
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import quote

from agentd.channels.attachments import Attachment, host_of, with_bearer

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.jwt_webhook import JwtWebhookAdapter
from agentd.channels.bases.jwtkeys import key_endorses
from agentd.channels.bases.webhook import Request

ISSUER = "https://api.botframework.com"
SCOPE = "https://api.botframework.com/.default"
FILE_INFO = "application/vnd.microsoft.teams.file.download.info"
# Inline images live on the Bot Connector's attachment store, read with the bot's token.
TOKEN_HOSTS = frozenset({"smba.trafficmanager.net", "botapi.skype.com"})
TOKEN_SUFFIXES = (".asm.skype.com",)
# Files of a personal chat: OneDrive/SharePoint URLs that carry their own authorisation.
PLAIN_SUFFIXES = (".sharepoint.com",)
INLINE_TYPES = ("image/png", "image/jpeg", "image/gif")
INLINE_MAX = 1024 * 1024  # Teams' limit for a base64 inline image
CONSENT = "application/vnd.microsoft.teams.card.file.consent"
FILE_CARD = "application/vnd.microsoft.teams.card.file.info"
CONSENT_TTL = 3600.0  # an unanswered consent card's file is forgotten after this
MAX_PENDING = 32
MAX_SEEN_HOSTS = 64
AT_TAG = re.compile(r"<at>.*?</at>\s*", re.IGNORECASE | re.DOTALL)  # the bot's @mention in channels


class TeamsAdapter(JwtWebhookAdapter):
    max_message_len = 10000
    keys_setting, keys_kind = "openid_url", "openid"
    issuer, audience_setting, leeway = ISSUER, "app_id", 300

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        # Hosts of files named by verified activities (their serviceUrl, tenants' SharePoint).
        self.seen_hosts: set[str] = set()
        # Files waiting for their FileConsentCard's answer: id -> (deadline, conversation, name, type, bytes).
        self.pending: OrderedDict[str, tuple[float, Conversation, str, str, bytes]] = OrderedDict()
        self.pending_lock = threading.Lock()

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 3978)

    def prepare(self) -> None:
        if not self.settings.get("app_id"):
            raise ChannelError("app_id is not set (the Azure Bot's Microsoft App ID)")
        self.env("app_password_env")

    def verify(self, request: Request) -> bool:
        try:
            verified = self.request_claims(request)
            if verified is None:
                return False
            activity = request.json()
        except (ChannelError, ValueError) as exc:
            self.ctx.log.info("teams activity refused: %s", exc)
            return False
        claims, jwk = verified
        if not isinstance(activity, dict):
            return False
        # The token is only good for the service URL it names: replies go there.
        claimed, given = str(claims.get("serviceUrl") or ""), str(activity.get("serviceUrl") or "")
        return bool(given) and claimed.rstrip("/") == given.rstrip("/") and \
            key_endorses(jwk, str(activity.get("channelId") or ""))

    def _inbound(self, request: Request) -> tuple[int, Any]:
        activity = request.json()
        pressed = activity.get("value") if isinstance(activity.get("value"), dict) else {}
        if pressed.get("agentd_approval") in ("approve", "reject") and pressed.get("approval_id"):
            activity = {**activity, "text": f"/{pressed['agentd_approval']} {pressed['approval_id']}"}
        else:
            pressed = {}
        if activity.get("type") == "invoke" and activity.get("name") == "fileConsent/invoke":
            return self._consented(activity)
        files = self._attachments(activity) if activity.get("type") == "message" else []
        if activity.get("type") != "message" or not (isinstance(activity.get("text"), str) or files):
            return 200, {}  # conversationUpdate, typing, reactions...
        sender, chat = activity.get("from") or {}, activity.get("conversation") or {}
        user = str(sender.get("id") or "")
        tenant = str(chat.get("tenantId") or ((activity.get("channelData") or {}).get("tenant") or {}).get("id") or "")
        allowed = [t.lower() for t in self.settings.get("allowed_tenants") or []]
        if allowed and tenant.lower() not in allowed:
            self.ctx.audit("refused", sender=user, chat=str(chat.get("id") or ""),
                           message_id=str(activity.get("id") or ""), reason="tenant not in allowed_tenants")
            return 200, {}
        # The bot is mentioned when a `mention` entity names the recipient (the bot's account).
        bot_id = str((activity.get("recipient") or {}).get("id") or "")
        mentioned = any(isinstance(e, dict) and e.get("type") == "mention"
                        and str((e.get("mentioned") or {}).get("id") or "") == bot_id
                        for e in activity.get("entities") or []) if bot_id else False
        text = AT_TAG.sub("", str(activity.get("text") or "")).strip()
        conversation = Conversation(self.name, str(chat.get("id") or ""), user,
                                    direct=chat.get("conversationType") in (None, "personal"),
                                    meta={"service_url": activity["serviceUrl"], "activity_id": str(activity.get("id") or ""),
                                          "bot": activity.get("recipient") or {}, "user": {"id": user, "name": sender.get("name")}})
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=text, message_id=str(activity.get("id") or ""),
                                 sender_name=str(sender.get("name") or ""),
                                 interaction={"card": str(activity.get("replyToId") or "")} if pressed else {},
                                 sender_aliases=(str(sender["aadObjectId"]),) if sender.get("aadObjectId") else (),
                                 mentioned=mentioned, attachments=files))
        return 200, {}

    def _attachments(self, activity: dict[str, Any]) -> list[Attachment]:
        service = host_of(str(activity.get("serviceUrl") or ""))
        found: list[Attachment] = []
        for n, item in enumerate(activity.get("attachments") or []):
            if not isinstance(item, dict):
                continue
            kind, name = str(item.get("contentType") or ""), str(item.get("name") or "")
            content = item.get("content") if isinstance(item.get("content"), dict) else {}
            if kind == FILE_INFO and isinstance(content.get("downloadUrl"), str):
                url = content["downloadUrl"]
                self._remember(url, service)
                ext = str(content.get("fileType") or "bin")
                found.append(Attachment(name or f"file-{n + 1}.{ext}", "", 0, url))
            elif kind.startswith("image/") and isinstance(item.get("contentUrl"), str):
                url = item["contentUrl"]
                self._remember(url, service)
                ext = kind.partition("/")[2] if kind != "image/*" else "png"
                found.append(self._with_token(Attachment(name or f"image-{n + 1}.{ext}", kind, 0, url), service))
        return found

    def _remember(self, url: str, service: str) -> None:
        host = host_of(url)
        if len(self.seen_hosts) < MAX_SEEN_HOSTS and (host == service or host.endswith(TOKEN_SUFFIXES + PLAIN_SUFFIXES)):
            self.seen_hosts.add(host)

    def _with_token(self, item: Attachment, service: str) -> Attachment:
        """The bot's token goes with the download, asked for only then, and only to the Bot
        Connector's own hosts."""
        host = host_of(item.url)
        if host == service or host in TOKEN_HOSTS or host.endswith(TOKEN_SUFFIXES):
            with_bearer(item, self.token.get)
        return item

    def file_hosts(self) -> set[str]:
        configured = host_of(str(self.settings.get("service_url") or ""))
        return set(TOKEN_HOSTS) | self.seen_hosts | ({configured} if configured else set())

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if content_type not in INLINE_TYPES or len(data) > INLINE_MAX:
            if not conversation.direct:
                raise ChannelError("teams: a bot posts files only in a personal chat (FileConsentCard); "
                                   f"here only images up to {INLINE_MAX} bytes, inline")
            return self._ask_consent(conversation, filename, content_type, data)
        url = self._activities_url(conversation)
        activity: dict[str, Any] = {"type": "message", "attachments": [{
            "contentType": content_type, "name": filename,
            "contentUrl": f"data:{content_type};base64," + base64.b64encode(data).decode()}]}
        reply_to = str(conversation.meta.get("activity_id") or "")
        if reply_to:
            url += "/" + quote(reply_to, safe="")
            activity.update(replyToId=reply_to, recipient=conversation.meta.get("user") or {})
        return self._post("POST", url, activity, conversation)

    def _fetch_token(self) -> tuple[str, float]:
        answer = self.http.json("POST", str(self.settings.get("token_url")), data={
            "grant_type": "client_credentials", "client_id": self.settings.get("app_id"),
            "client_secret": self.env("app_password_env"), "scope": SCOPE})
        return self.access_token(answer, "teams")

    def send(self, conversation: Conversation, text: str) -> str:
        meta = conversation.meta
        base = str(meta.get("service_url") or self.settings.get("service_url") or "").rstrip("/")
        url = f"{base}/v3/conversations/{quote(conversation.chat_id, safe='')}/activities"
        reply_to = meta.get("activity_id") or ""
        if reply_to:
            url += "/" + quote(reply_to, safe="")
        activity_id = ""
        for part in self.reply_texts(text):
            activity: dict[str, Any] = {"type": "message", "text": part, "textFormat": "markdown",
                                        "conversation": {"id": conversation.chat_id}}
            if meta.get("bot"):
                activity["from"] = meta["bot"]
            if reply_to:
                activity.update(replyToId=reply_to, recipient=meta.get("user") or {})
            answer = self.http.json("POST", url, json=activity,
                                    headers={"Authorization": "Bearer " + self.token.get()})
            activity_id = str(answer.get("id") or "") if isinstance(answer, dict) else ""
        return activity_id

    def _ask_consent(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        consent = secrets.token_urlsafe(16)
        now = time.monotonic()
        with self.pending_lock:
            for key in [k for k, v in self.pending.items() if v[0] < now]:
                del self.pending[key]
            while len(self.pending) >= MAX_PENDING:
                self.pending.popitem(last=False)
            self.pending[consent] = (now + CONSENT_TTL, conversation, filename, content_type, data)
        context = {"agentd_file": consent}
        return self._post("POST", self._activities_url(conversation), {"type": "message", "attachments": [{
            "contentType": CONSENT, "name": filename, "content": {
                "description": f"{filename} ({len(data)} bytes) from the agent", "sizeInBytes": len(data),
                "acceptContext": context, "declineContext": context}}]}, conversation)

    def _consented(self, activity: dict[str, Any]) -> tuple[int, Any]:
        """The user's answer to a FileConsentCard: on Allow the file goes to the upload URL
        Teams gives (on a thread: the invoke is answered at once), then its card is posted."""
        value = activity.get("value") if isinstance(activity.get("value"), dict) else {}
        consent = str((value.get("context") or {}).get("agentd_file") or "")
        chat = str((activity.get("conversation") or {}).get("id") or "")
        with self.pending_lock:
            waiting = self.pending.get(consent)
            if waiting is None or waiting[1].chat_id != chat:
                return 200, {}  # not ours, already answered, or forgotten
            del self.pending[consent]
        if value.get("action") == "accept" and isinstance(value.get("uploadInfo"), dict):
            self._threads = [t for t in self._threads if t.is_alive()]
            self.spawn(lambda: self._upload(waiting[1], value["uploadInfo"], *waiting[2:]), "upload")
        return 200, {}

    def _upload(self, conversation: Conversation, info: dict[str, Any], filename: str, content_type: str,
                data: bytes) -> None:
        url, service = str(info.get("uploadUrl") or ""), host_of(str(conversation.meta.get("service_url") or ""))
        host = host_of(url)
        if not url.startswith(("https://", "http://")) or not (host == service or host.endswith(PLAIN_SUFFIXES)):
            self.ctx.audit("send_failed", file=filename, error=f"upload URL off SharePoint ({host or 'none'})")
            return
        try:  # a pre-authenticated upload session: no token goes with it
            self.http.request("PUT", url, data=data, headers={
                "Content-Type": content_type or "application/octet-stream",
                "Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"})
            sent = self._post("POST", self._activities_url(conversation), {"type": "message", "attachments": [{
                "contentType": FILE_CARD, "name": str(info.get("name") or filename),
                "contentUrl": str(info.get("contentUrl") or ""),
                "content": {"uniqueId": str(info.get("uniqueId") or ""), "fileType": str(info.get("fileType") or "")}}]},
                conversation)
        except ChannelError as exc:
            self.ctx.audit("send_failed", file=filename, error=str(exc)[:300])
            return
        self.ctx.audit("file_uploaded", message_id=sent, file=filename, conversation=conversation.key)

    def _activities_url(self, conversation: Conversation) -> str:
        base = str(conversation.meta.get("service_url") or self.settings.get("service_url") or "").rstrip("/")
        return f"{base}/v3/conversations/{quote(conversation.chat_id, safe='')}/activities"

    def _post(self, method: str, url: str, activity: dict[str, Any], conversation: Conversation,
              retries: int | None = None) -> str:
        activity.setdefault("conversation", {"id": conversation.chat_id})
        if conversation.meta.get("bot"):
            activity["from"] = conversation.meta["bot"]
        answer = self.http.json(method, url, json=activity, retries=retries,
                                headers={"Authorization": "Bearer " + self.token.get()})
        return str(answer.get("id") or "") if isinstance(answer, dict) else ""

    def send_typing(self, conversation: Conversation) -> None:
        self._post("POST", self._activities_url(conversation), {"type": "typing"}, conversation, retries=0)

    def send_approval(self, conversation: Conversation, approval_id: str, text: str) -> str:
        card = {"type": "AdaptiveCard", "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
                "version": "1.4", "body": [{"type": "TextBlock", "text": text, "wrap": True}],
                "actions": [{"type": "Action.Submit", "title": title,
                             "data": {"agentd_approval": verb, "approval_id": approval_id}}
                            for verb, title in (("approve", "Approve"), ("reject", "Reject"))]}
        return self._post("POST", self._activities_url(conversation), {
            "type": "message", "text": text, "attachments": [
                {"contentType": "application/vnd.microsoft.card.adaptive", "content": card}]}, conversation)

    def settle_approval(self, conversation: Conversation, request_id: str, text: str) -> None:
        self._post("PUT", f"{self._activities_url(conversation)}/{quote(request_id, safe='')}",
                   {"type": "message", "id": request_id, "text": text, "attachments": []}, conversation)

    def answer_interaction(self, msg: Inbound, text: str, final: bool) -> bool:
        card = msg.interaction.get("card")
        if not final or not card:
            return False  # Teams has no message for one person alone: the answer is posted
        self._post("PUT", f"{self._activities_url(msg.conversation)}/{quote(card, safe='')}",
                   {"type": "message", "id": card, "text": text, "attachments": []}, msg.conversation)
        return True

    def test_target(self, override: str = "") -> Conversation:
        if not override:
            raise ChannelError("pass chat_id (a Teams conversation id the bot is in) to send a test message")
        return Conversation(self.name, override, "", direct=False)


ADAPTER = TeamsAdapter
