"""Discourse REST API (`Api-Key` + `Api-Username` headers): polls `GET /posts.json`
(the site's latest posts) from a persisted post id, replies with `POST /posts.json`
{topic_id, raw, reply_to_post_number}. Answers posts that mention @api_username, and
every post in `categories` (ids or slugs) when that list is set. History from before
the first start is not answered."""

from __future__ import annotations

from typing import Any

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.bases.polling import PollingAdapter


class DiscourseAdapter(PollingAdapter):
    max_message_len = 32_000

    def prepare(self) -> None:
        self.base = str(self.settings.get("base_url") or "").rstrip("/")
        if not self.base:
            raise ChannelError("base_url is not set")
        self.username = str(self.settings.get("api_username") or "system")
        self.http.session.headers.update({"Api-Key": self.env("api_key_env"), "Api-Username": self.username,
                                          "Accept": "application/json"})
        self.categories = {str(c).lower() for c in self.settings.get("categories") or []}
        self.poll_interval = float(self.settings.get("poll_interval_secs") or 5)
        self._slugs: dict[str, str] = {}

    def poll_once(self) -> None:
        posts = self.http.json("GET", f"{self.base}/posts.json", retries=0).get("latest_posts") or []
        newest = max((int(p["id"]) for p in posts), default=0)
        last = self.state.get("last_post_id")
        if last is None:  # first start: remember where we are, answer nothing old
            self.save_cursor(last_post_id=newest)
            return
        for post in sorted((p for p in posts if int(p["id"]) > int(last)), key=lambda p: int(p["id"])):
            self.save_cursor(last_post_id=int(post["id"]))
            self._handle(post)

    def _handle(self, post: dict[str, Any]) -> None:
        username = str(post.get("username") or "")
        if username.lower() == self.username.lower() or post.get("post_type", 1) != 1:
            return  # our own posts, moderator actions, whispers
        text = str(post.get("raw") or "")
        mention = f"@{self.username}".lower()
        in_category = bool(self.categories) and self._category(post) & self.categories
        if mention not in text.lower() and not in_category:
            return
        text = " ".join(w for w in text.split() if w.lower() != mention)
        conversation = Conversation(self.name, str(post["topic_id"]), username,
                                    meta={"post_number": post.get("post_number")})
        self.ctx.deliver(Inbound(conversation, sender_id=username, text=text, message_id=str(post["id"]),
                                 sender_name=str(post.get("name") or username)))

    def _category(self, post: dict[str, Any]) -> set[str]:
        """The post's category as id and slug (slugs from /categories.json, cached)."""
        category = str(post.get("category_id", ""))
        if category and category not in self._slugs:
            listing = self.http.json("GET", f"{self.base}/categories.json", retries=0)
            for item in (listing.get("category_list") or {}).get("categories") or []:
                self._slugs[str(item["id"])] = str(item.get("slug", "")).lower()
        return {category, self._slugs.get(category, "")} - {""}

    def send(self, conversation: Conversation, text: str) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        ids = []
        for part in self.reply_texts(text):
            body: dict[str, Any] = {"topic_id": int(conversation.chat_id), "raw": part}
            if conversation.meta.get("post_number"):
                body["reply_to_post_number"] = conversation.meta["post_number"]
            ids.append(str(self.http.json("POST", f"{self.base}/posts.json", json=body).get("id", "")))
        return ",".join(ids)

    def test_target(self, override: str = "") -> Conversation:
        if not override.isdigit():
            raise ChannelError("no test target: pass chat_id (a topic id to post into)")
        return Conversation(self.name, override)


ADAPTER = DiscourseAdapter
