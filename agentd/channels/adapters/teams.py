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

Docs: https://learn.microsoft.com/azure/bot-service/rest-api/bot-framework-rest-connector-authentication
and .../bot-framework-rest-connector-send-and-receive-messages
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.jwt_webhook import JwtWebhookAdapter
from agentd.channels.bases.jwtkeys import key_endorses
from agentd.channels.bases.webhook import Request

ISSUER = "https://api.botframework.com"
SCOPE = "https://api.botframework.com/.default"
AT_TAG = re.compile(r"<at>.*?</at>\s*", re.IGNORECASE | re.DOTALL)  # the bot's @mention in channels


class TeamsAdapter(JwtWebhookAdapter):
    max_message_len = 10000
    keys_setting, keys_kind = "openid_url", "openid"
    issuer, audience_setting, leeway = ISSUER, "app_id", 300

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
        if activity.get("type") != "message" or not isinstance(activity.get("text"), str):
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
        text = AT_TAG.sub("", activity["text"]).strip()
        conversation = Conversation(self.name, str(chat.get("id") or ""), user,
                                    direct=chat.get("conversationType") in (None, "personal"),
                                    meta={"service_url": activity["serviceUrl"], "activity_id": str(activity.get("id") or ""),
                                          "bot": activity.get("recipient") or {}, "user": {"id": user, "name": sender.get("name")}})
        self.ctx.deliver(Inbound(conversation, sender_id=user, text=text, message_id=str(activity.get("id") or ""),
                                 sender_name=str(sender.get("name") or ""),
                                 interaction={"card": str(activity.get("replyToId") or "")} if pressed else {},
                                 sender_aliases=(str(sender["aadObjectId"]),) if sender.get("aadObjectId") else (),
                                 mentioned=mentioned))
        return 200, {}

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
