"""DingTalk robot: outgoing-robot callbacks on the adapter's own listener, verified by the
`timestamp` + `sign` headers (base64 HMAC-SHA256 keyed with the robot's secret over
"<timestamp>\\n<secret>", the timestamp within one hour) before parsing. Replies go to the
callback's `sessionWebhook` while it is valid, else to the custom robot webhook
`/robot/send?access_token=..&timestamp=..&sign=..` (signed the same way).

Files need the robot's app (`app_key`, its AppKey and robotCode, and `app_secret_env`):
`picture`, `file`, `audio`, `video` and `richText` callbacks carry a `downloadCode`, which
`POST {openapi_url}/v1.0/robot/messageFiles/download` (with the app's accessToken from
`/v1.0/oauth2/accessToken`) turns into a temporary download URL; only that answer's host,
or the Open API's own, is fetched from (the callback names no URL). Files go out uploaded
with `POST {api_url}/media/upload` (the app's `gettoken` token), then as a robot message
(`sampleImageMsg` or `sampleFile`): `/v1.0/robot/oToMessages/batchSend` to the sender of a
direct chat, `/v1.0/robot/groupMessages/send` to a group's openConversationId. Without
the app, a file sent to the robot is not fetched and none is sent.

Docs: https://open.dingtalk.com/document/orgapp/receive-message (callbacks) and
https://open.dingtalk.com/document/robots/custom-robot-access (custom robot, signing).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from agentd import hmacs
from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.sender import HttpSender
from agentd.channels.bases.tokens import CachedToken
from agentd.channels.bases.webhook import Request, WebhookAdapter

API_URL = "https://oapi.dingtalk.com"
OPENAPI_URL = "https://api.dingtalk.com"
FILE_TYPES = ("picture", "file", "audio", "video", "richText")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/bmp")
WINDOW_MS = 3600 * 1000  # DingTalk refuses callbacks older than an hour; so do we
SESSION_MARGIN_MS = 30 * 1000  # don't start a send on a session webhook about to expire


def dingtalk_sign(secret: str, timestamp: str) -> str:
    """base64(HMAC-SHA256(secret, "<timestamp>\\n<secret>")), as both directions use it."""
    return hmacs.b64_digest(secret, f"{timestamp}\n{secret}")


class DingTalkAdapter(WebhookAdapter):
    max_message_len = 5000
    text_format = "plain"

    def __init__(self, ctx, settings) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ctx, settings)
        self.http = HttpSender(stop=self.stopping)
        self.app_token = CachedToken(self._fetch_app_token)  # the Open API's (api.dingtalk.com)
        self.oapi_token = CachedToken(self._fetch_oapi_token)  # the classic API's (oapi.dingtalk.com)
        # Hosts DingTalk's download API named. The runtime holds this very set while it
        # fetches a message's files, so a host added when a download URL is asked for counts.
        self.hosts: set[str] = set()
        self.hosts_lock = threading.Lock()

    def base(self) -> str:
        return (self.settings.get("api_url") or API_URL).rstrip("/")

    def listen_port(self) -> int:
        return int(self.settings.get("webhook_port") or 8457)

    def prepare(self) -> None:
        self.env("secret_env")
        self.env("access_token_env")

    def verify(self, request: Request) -> bool:
        secret = self.env("secret_env", required=False)
        timestamp, given = request.headers.get("timestamp") or "", request.headers.get("sign") or ""
        if not (secret and timestamp.isdigit() and given):
            return False
        if abs(time.time() * 1000 - int(timestamp)) > WINDOW_MS:
            return False
        return hmacs.check(secret, f"{timestamp}\n{secret}", given, encoding="base64")

    def _inbound(self, request: Request) -> tuple[int, Any]:
        data = request.json()
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        kind = data.get("msgtype")
        text = (data.get("text") or {}).get("content") if kind == "text" else None
        files: list[Attachment] = []
        if kind in FILE_TYPES and isinstance(data.get("content"), dict):
            files = self._attachments(data)
            text = _rich_text(data["content"]) if kind == "richText" else str(data["content"].get("recognition") or "")
        if isinstance(text, str) and (text.strip() or files):
            user = str(data.get("senderStaffId") or data.get("senderId") or "")
            aliases = tuple(str(v) for v in (data.get("senderId"), data.get("senderNick")) if v)
            meta = {"session_webhook": self._trusted(data.get("sessionWebhook")),
                    "session_expires": int(data.get("sessionWebhookExpiredTime") or 0), "staff_id": user,
                    "conversation_id": str(data.get("conversationId") or "")}
            conversation = Conversation(self.name, str(data.get("conversationId") or user), user,
                                        direct=str(data.get("conversationType")) == "1", meta=meta)
            self.ctx.deliver(Inbound(conversation, sender_id=user, text=text.strip(),
                                     message_id=str(data.get("msgId") or ""), attachments=files,
                                     sender_name=str(data.get("senderNick") or ""), sender_aliases=aliases))
        return 200, {}  # the answer follows through the session webhook

    def openapi(self) -> str:
        return str(self.settings.get("openapi_url") or OPENAPI_URL).rstrip("/")

    def _app(self) -> tuple[str, str]:
        """(AppKey, AppSecret) of the robot's app, or empty strings without one."""
        key = str(self.settings.get("app_key") or "")
        return (key, self.env("app_secret_env", required=False)) if key else ("", "")

    def _attachments(self, data: dict[str, Any]) -> list[Attachment]:
        if not all(self._app()):
            self.ctx.log.info("dingtalk files not fetched: set app_key and app_secret_env to receive them")
            return []
        content, kind, message = data["content"], str(data["msgtype"]), str(data.get("msgId") or "message")
        items = [i for i in content.get("richText") or [] if isinstance(i, dict)] if kind == "richText" else [content]
        found = []
        for n, item in enumerate(items, 1):
            code = item.get("downloadCode")
            if not isinstance(code, str) or not code:
                continue
            kind_of = str(item.get("type") or kind)
            name = str(item.get("fileName") or f"{kind_of}-{message}-{n}")
            found.append(Attachment(name, "", 0, locate=lambda code=code: self._download_url(code)))
        return found

    def _download_url(self, code: str) -> str:
        answer = self.http.json("POST", self.openapi() + "/v1.0/robot/messageFiles/download",
                                json={"downloadCode": code, "robotCode": self._app()[0]},
                                headers={"x-acs-dingtalk-access-token": self.app_token.get()})
        url = answer.get("downloadUrl") if isinstance(answer, dict) else None
        if not isinstance(url, str) or not url:
            raise ChannelError("dingtalk messageFiles/download: no downloadUrl")
        with self.hosts_lock:  # DingTalk's own answer names where its file is
            self.hosts.add(host_of(url))
        return url

    def file_hosts(self) -> set[str]:
        with self.hosts_lock:
            self.hosts.add(host_of(self.openapi()))
        return self.hosts

    def _fetch_app_token(self) -> tuple[str, float]:
        key, secret = self._app()
        answer = self.http.json("POST", self.openapi() + "/v1.0/oauth2/accessToken",
                                json={"appKey": key, "appSecret": secret})
        if not isinstance(answer, dict) or not answer.get("accessToken"):
            raise ChannelError("dingtalk accessToken: no accessToken in the answer")
        return str(answer["accessToken"]), float(answer.get("expireIn") or 7200)

    def _fetch_oapi_token(self) -> tuple[str, float]:
        key, secret = self._app()
        answer = self.http.json("GET", self.base() + "/gettoken", params={"appkey": key, "appsecret": secret})
        if not isinstance(answer, dict) or answer.get("errcode") != 0 or not answer.get("access_token"):
            raise ChannelError(f"dingtalk gettoken: {answer.get('errmsg') if isinstance(answer, dict) else answer}")
        return str(answer["access_token"]), float(answer.get("expires_in") or 7200)

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        key, secret = self._app()
        if not (key and secret):
            raise ChannelError("dingtalk: files are sent by the robot's app: set app_key and app_secret_env")
        image = content_type in IMAGE_TYPES
        answer = self.http.json("POST", self.base() + "/media/upload",
                                params={"access_token": self.oapi_token.get()}, data={"type": "image" if image else "file"},
                                files={"media": (filename, data, content_type)})
        if not isinstance(answer, dict) or answer.get("errcode") != 0 or not answer.get("media_id"):
            raise ChannelError(f"dingtalk media/upload: {answer.get('errmsg') if isinstance(answer, dict) else answer}")
        media = str(answer["media_id"])
        if image:
            msg_key, param = "sampleImageMsg", {"photoURL": media}
        else:
            msg_key, param = "sampleFile", {"mediaId": media, "fileName": filename,
                                            "fileType": filename.rpartition(".")[2].lower() or "file"}
        body: dict[str, Any] = {"robotCode": key, "msgKey": msg_key, "msgParam": json.dumps(param, ensure_ascii=False)}
        if conversation.direct:
            path = "/v1.0/robot/oToMessages/batchSend"
            body["userIds"] = [conversation.meta.get("staff_id") or conversation.user_id]
        else:
            path = "/v1.0/robot/groupMessages/send"
            body["openConversationId"] = conversation.meta.get("conversation_id") or conversation.chat_id
        sent = self.http.json("POST", self.openapi() + path, json=body,
                              headers={"x-acs-dingtalk-access-token": self.app_token.get()})
        return str((sent or {}).get("processQueryKey") or "") if isinstance(sent, dict) else ""

    def _trusted(self, url: Any) -> str:
        # The signature covers only the timestamp, not the body: never post to a host
        # other than DingTalk's own API (or the configured api_url), whatever a body says.
        if not isinstance(url, str):
            return ""
        ours, theirs = urlsplit(self.base()), urlsplit(url)
        return url if (theirs.scheme, theirs.netloc) == (ours.scheme, ours.netloc) else ""

    def send(self, conversation: Conversation, text: str) -> str:
        for part in self.reply_texts(text):
            payload: dict[str, Any] = {"msgtype": "text", "text": {"content": part}}
            session = conversation.meta.get("session_webhook") or ""
            expires = int(conversation.meta.get("session_expires") or 0)
            if session and time.time() * 1000 < expires - SESSION_MARGIN_MS:
                if not conversation.direct and conversation.meta.get("staff_id"):
                    payload["at"] = {"atUserIds": [conversation.meta["staff_id"]]}
                self._post(session, payload)
            else:  # the session expired: the custom robot webhook of the robot's group
                timestamp = str(int(time.time() * 1000))
                secret = self.env("secret_env")
                self._post(self.base() + "/robot/send", payload, params={
                    "access_token": self.env("access_token_env"), "timestamp": timestamp,
                    "sign": dingtalk_sign(secret, timestamp)})
        return ""  # DingTalk's robot answers carry no message id

    def _post(self, url: str, payload: dict[str, Any], params: dict[str, str] | None = None) -> None:
        answer = self.http.json("POST", url, json=payload, params=params)
        if not isinstance(answer, dict) or answer.get("errcode") not in (0, None):
            message = answer.get("errmsg") if isinstance(answer, dict) else "not JSON"
            raise ChannelError(f"dingtalk send: errcode {answer.get('errcode') if isinstance(answer, dict) else '?'}"
                               f" {message}")

    def test_target(self, override: str = "") -> Conversation:
        # The custom robot webhook posts to the group the robot belongs to.
        return Conversation(self.name, override or "robot-webhook", "", direct=False)

    def close(self) -> None:
        super().close()
        self.http.close()


def _rich_text(content: dict[str, Any]) -> str:
    """The words of a richText callback (its pictures are files)."""
    return "".join(str(i.get("text") or "") for i in content.get("richText") or [] if isinstance(i, dict))


ADAPTER = DingTalkAdapter
