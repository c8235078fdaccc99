"""Discourse REST API (`Api-Key` + `Api-Username` headers): polls `GET /posts.json`
(the site's latest posts) from a persisted post id, replies with `POST /posts.json`
{topic_id, raw, reply_to_post_number}. Answers posts that mention @api_username, and
every post in `categories` (ids or slugs) when that list is set. History from before
the first start is not answered.

Files: the uploads a post shows (in its cooked HTML, `<img>` and `<a class="attachment">`
under `/uploads/`) are fetched with the API headers from the forum's host only; files go out
with `POST /uploads.json` (multipart `file`, `type=composer`, `synchronous=true`), then a
post carrying the upload's markdown (`![name|WxH](upload://...)` for an image,
`[name|attachment](upload://...) (size)` otherwise)."""

from __future__ import annotations

import mimetypes
import re
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from agentd.channels.adapter import ChannelError, Conversation, Inbound
from agentd.channels.attachments import Attachment, host_of
from agentd.channels.bases.polling import PollingAdapter
from agentd.channels.conversation import without_mention


UPLOAD_MARKDOWN = re.compile(r"!?\[[^\]\n]*\]\(upload://[^)\s]+\)(?: \([^)\n]*\))?")


class _Uploads(HTMLParser):
    """The uploads cooked HTML shows: (url, name) of attachment links and images (a lightbox's
    original rather than its thumbnail), never emoji, avatars or a link preview's pictures."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str]] = []
        self.link: tuple[str, str] | None = None  # an open <a>: (href, class)
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "a":
            self.link, self.text = (a.get("href", ""), a.get("class", "")), []
        elif tag == "img" and "/uploads/" in a.get("src", "") \
                and not {"emoji", "avatar", "thumbnail", "site-icon"} & set(a.get("class", "").split()):
            if self.link and "lightbox" in self.link[1].split():
                return  # the lightbox link names the original
            self.found.append((a["src"], ""))

    def handle_data(self, data: str) -> None:
        if self.link:
            self.text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag != "a" or not self.link:
            return
        href, classes = self.link
        if "/uploads/" in href and ({"attachment", "lightbox"} & set(classes.split())):
            self.found.append((href, "".join(self.text).strip() if "attachment" in classes.split() else ""))
        self.link = None


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
        text = UPLOAD_MARKDOWN.sub("", str(post.get("raw") or "")).strip()
        mention = f"@{self.username}".lower()
        in_category = bool(self.categories) and self._category(post) & self.categories
        addressed = mention in text.lower() or in_category
        text = without_mention(text, rf"(?<!\S){re.escape(mention)}(?!\S)")
        conversation = Conversation(self.name, str(post["topic_id"]), username,
                                    meta={"post_number": post.get("post_number")})
        self.ctx.deliver(Inbound(conversation, sender_id=username, text=text, message_id=str(post["id"]),
                                 sender_name=str(post.get("name") or username), attachments=self._files(post),
                                 addressed=bool(addressed)))

    def _files(self, post: dict[str, Any]) -> list[Attachment]:
        parser = _Uploads()
        parser.feed(str(post.get("cooked") or ""))
        parser.close()
        files, seen = [], set()
        for href, name in parser.found:
            url = urljoin(self.base + "/", href)
            if url in seen:
                continue
            seen.add(url)
            name = name or unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or "upload"
            headers = dict(self.http.session.headers) if host_of(url) == host_of(self.base) else {}
            files.append(Attachment(name, mimetypes.guess_type(name)[0] or "", 0, url,
                                    headers={k: str(v) for k, v in headers.items() if k in ("Api-Key", "Api-Username")}))
        return files

    def file_hosts(self) -> set[str]:
        return {host_of(str(self.settings.get("base_url") or ""))}

    def send_file(self, conversation: Conversation, filename: str, content_type: str, data: bytes) -> str:
        if not hasattr(self, "base"):
            self.prepare()
        upload = self.http.json("POST", f"{self.base}/uploads.json", data={"type": "composer", "synchronous": "true"},
                                files={"file": (filename, data, content_type)})
        short = str(upload.get("short_url") or upload.get("url") or "")
        label = filename.replace("[", "(").replace("]", ")").replace("|", "-")
        if content_type.startswith("image/") and upload.get("width"):
            raw = f"![{label}|{upload['width']}x{upload.get('height') or upload['width']}]({short})"
        else:
            raw = f"[{label}|attachment]({short}) ({upload.get('human_filesize') or str(len(data)) + ' Bytes'})"
        body: dict[str, Any] = {"topic_id": int(conversation.chat_id), "raw": raw}
        if conversation.meta.get("post_number"):
            body["reply_to_post_number"] = conversation.meta["post_number"]
        return str(self.http.json("POST", f"{self.base}/posts.json", json=body).get("id", ""))

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
