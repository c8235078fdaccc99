"""Reddit API for a script app: OAuth2 password grant at `{auth_url}/api/v1/access_token`
(client id + secret as HTTP Basic, renewed before it expires or on 401), polls
`GET {api_url}/r/{subreddit}/comments/new.json` for each subreddit and answers comments
that mention u/<username> or reply to the bot; replies with `POST /api/comment`
{thing_id, text}. Seen comments are remembered; history before the first start is not
answered."""

from __future__ import annotations

import re
import time
from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import without_mention

USER_AGENT = "agentd-channel/1.0 (by agentd)"


class RedditAdapter(PollingAdapter):
    max_message_len = 10_000

    def prepare(self) -> None:
        self.api_url = str(self.settings.get("api_url") or "https://oauth.reddit.com").rstrip("/")
        self.auth_url = str(self.settings.get("auth_url") or "https://www.reddit.com").rstrip("/")
        self.username = str(self.settings.get("username") or "")
        self.client_id = str(self.settings.get("client_id") or "")
        if not self.username or not self.client_id:
            raise ChannelError("client_id and username must be set")
        self.secret, self.password = self.env("client_secret_env"), self.env("password_env")
        self.http.session.headers["User-Agent"] = USER_AGENT
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 10)
        self.expires = 0.0

    def token(self) -> None:
        """Fetch a bearer token when there is none or it is about to expire."""
        if time.monotonic() < self.expires - 60:
            return
        data = self.http.json("POST", f"{self.auth_url}/api/v1/access_token", auth=(self.client_id, self.secret),
                              data={"grant_type": "password", "username": self.username,
                                    "password": self.password}, retries=1)
        if "access_token" not in data:
            raise ChannelError(f"access_token: {data.get('error', data)}")
        self.http.session.headers["Authorization"] = f"bearer {data['access_token']}"
        self.expires = time.monotonic() + float(data.get("expires_in", 3600))

    def poll_once(self) -> None:
        self.token()
        seen = list(self.state.get("seen") or [])
        first = "seen" not in self.state
        for sub in self.settings.get("subreddits") or []:
            try:
                listing = self.http.json("GET", f"{self.api_url}/r/{sub}/comments/new.json",
                                         params={"limit": 100, "raw_json": 1}, retries=0)
            except ChannelError as exc:
                if "HTTP 401" in str(exc):
                    self.expires = 0.0  # token revoked or expired early: fetch a new one next round
                raise
            children = [c["data"] for c in listing["data"]["children"] if c.get("kind") == "t1"]
            for comment in sorted(children, key=lambda c: c.get("created_utc", 0)):
                if comment["name"] in seen:
                    continue
                seen.append(comment["name"])
                self.save_cursor(seen=seen[-500:])
                if not first:
                    self._handle(comment)
        if first:
            self.save_cursor(seen=seen[-500:])

    def _handle(self, comment: dict[str, Any]) -> None:
        author, text = str(comment.get("author") or ""), str(comment.get("body") or "")
        mention = f"u/{self.username}".lower()
        ours = set(self.state.get("own") or [])
        if author.lower() == self.username.lower():
            return
        addressed = mention in text.lower() or comment.get("parent_id") in ours
        text = without_mention(text, rf"(?<!\S)/?{re.escape(mention)}(?!\S)")
        conversation = Conversation(self.name, str(comment.get("subreddit")), author,
                                    meta={"thing_id": comment["name"]})
        self.ctx.deliver(Inbound(conversation, sender_id=author, text=text, message_id=comment["name"],
                                 sender_name=author, addressed=addressed))

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "api_url"):
            self.prepare()
        self.token()
        parent, names = conversation.meta.get("thing_id"), []
        if not parent:
            raise ChannelError("reddit replies need a comment or post to answer (thing_id)")
        for part in self.reply_texts(text):
            data = self.http.json("POST", f"{self.api_url}/api/comment",
                                  data={"api_type": "json", "thing_id": parent, "text": part})
            errors = (data.get("json") or {}).get("errors")
            if errors:
                raise ChannelError(f"comment: {errors}")
            parent = data["json"]["data"]["things"][0]["data"]["name"]  # next part answers this one
            names.append(parent)
        self.save_cursor(own=(list(self.state.get("own") or []) + names)[-200:])
        return ",".join(names)

    def test_target(self, override: str = "") -> Conversation:
        if not override.startswith(("t1_", "t3_")):
            raise ChannelError("no test target: pass chat_id, the fullname (t3_... post or t1_... comment) "
                               "to reply to")
        return Conversation(self.name, override, meta={"thing_id": override})


ADAPTER = RedditAdapter
