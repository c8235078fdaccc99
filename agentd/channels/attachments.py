"""Files and images in channel conversations, both ways.

Inbound: an adapter lists a message's files as `Attachment`s (where each is, what the
platform says it is). `ChannelFiles.receive` fetches them on the dispatcher's worker, never
in the adapter's reader: only from the adapter's own hosts (`Adapter.file_hosts()`; a
redirect is followed only when it stays on them), up to `[channels] max_file_bytes`, and
types the bytes by sniffing them (the declared type is only a claim). Each accepted file
becomes an upload of the agent (the store behind `/api/agents/{id}/uploads`) and a copy
under `inbox/` in its workspace, where the file tools read it. An image goes to a model
that accepts images as an image part; any other model gets a note with its name and size.

Outbound: what the run's tools made (an upload named by `file_id` in a tool result:
generated images, speech, screenshots) and what it wrote under `output/` with
`file_write` go back to the conversation through `Adapter.send_file`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urljoin, urlsplit

from agentd.agents.handle import UPLOAD_LIMIT, UPLOAD_TYPES
from agentd.errors import AgentdError
from agentd.filetypes import sniff

if TYPE_CHECKING:
    from agentd.agents.handle import AgentHandle
    from agentd.agents.loop import RunResult
    from agentd.agents.uploads import Uploads
    from agentd.llm.catalog import Catalog

log = logging.getLogger("agentd.channels.files")
MAX_REDIRECTS = 3
# What the providers' image parts take; other images are kept as files with a note.
MODEL_IMAGES = ("image/png", "image/jpeg", "image/gif", "image/webp")
FILE_ID = re.compile(r'"file_id":\s*"([0-9a-fA-F-]{36})"')
INBOX = "inbox"


@dataclass
class Attachment:
    """One file of an inbound message, as the platform describes it."""

    filename: str
    content_type: str = ""  # declared by the platform or the sender: checked, never trusted
    size: int = 0  # declared size (0: unknown); over the cap, the file is not fetched at all
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict, repr=False)  # the platform's credentials
    data: bytes | None = field(default=None, repr=False)  # carried in the message itself (email)
    # Where the file is, asked of the platform only when it is fetched (Telegram's getFile).
    locate: Callable[[], str] | None = field(default=None, repr=False)
    # The file from the bytes as stored, for a platform that stores files encrypted (Threema's blobs).
    open: Callable[[bytes], bytes] | None = field(default=None, repr=False)


class FileRefused(Exception):
    """A file not taken; the message is said to the person who sent it."""


@dataclass
class Received:
    """What an inbound message's files became."""

    notes: list[str] = field(default_factory=list)  # lines for the model, after the message's text
    images: list[dict[str, Any]] = field(default_factory=list)  # `attachments` of the run (image parts)
    refused: list[str] = field(default_factory=list)  # sentences for the sender


@dataclass
class Outgoing:
    filename: str
    content_type: str
    data: bytes = field(repr=False)


def with_bearer(item: Attachment, token: Callable[[], str]) -> Attachment:
    """`item` fetched with `Authorization: Bearer <token()>`, the token asked for only when the
    file is fetched, on the conversation's worker, so a slow token endpoint never holds up intake."""
    def locate(url: str = item.url) -> str:
        item.headers["Authorization"] = "Bearer " + token()
        return url
    item.locate = locate
    return item


def host_of(url: str) -> str:
    """`host`, or `host:port` for a port other than the scheme's own, lower-case."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    default = {"https": 443, "http": 80}.get(parts.scheme)
    return f"{host}:{parts.port}" if parts.port and parts.port != default else host


def allowed(url: str, hosts: set[str]) -> bool:
    """`url` is on `hosts`: a `host` / `host:port` as listed, or under a `.domain` entry (a
    platform whose CDN spreads files over many hosts of its own domain, on the default port)."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return False
    host = host_of(url)
    return host in hosts or any(h.startswith(".") and host.endswith(h) for h in hosts)


def fetch(url: str, hosts: set[str], headers: dict[str, str], limit: int, timeout: float = 30.0) -> bytes:
    """The file's bytes: from an allowed host only, redirects only within them, at most `limit`."""
    import requests

    session = requests.Session()
    session.trust_env = False
    try:
        for _ in range(MAX_REDIRECTS + 1):
            if not allowed(url, hosts):
                raise FileRefused(f"it is not hosted by the platform ({host_of(url) or 'no host'})")
            try:
                response = session.get(url, headers=headers, stream=True, allow_redirects=False,
                                       timeout=(10.0, timeout))
            except requests.RequestException as exc:
                raise FileRefused(f"it could not be downloaded ({type(exc).__name__})") from None
            with response:
                if response.is_redirect:
                    target = urljoin(url, response.headers.get("Location") or "")
                    if host_of(target) != host_of(url):
                        headers = {}  # credentials stay with the host they were made for
                    url = target
                    continue
                if response.status_code >= 400:
                    raise FileRefused(f"it could not be downloaded (HTTP {response.status_code})")
                length = response.headers.get("Content-Length") or ""
                if length.isdigit() and int(length) > limit:
                    raise FileRefused(too_large(int(length), limit))
                data = bytearray()
                for chunk in response.iter_content(65536):
                    data += chunk
                    if len(data) > limit:
                        raise FileRefused(too_large(0, limit))
                return bytes(data)
        raise FileRefused("it is behind too many redirects")
    finally:
        session.close()


def too_large(size: int, limit: int) -> str:
    if size:
        return f"it is {size} bytes; files up to {limit} bytes are accepted here"
    return f"it is over {limit} bytes, the most accepted here"


class ChannelFiles:
    """Inbound files into uploads and workspace; a run's files back out."""

    def __init__(self, uploads: "Uploads", catalog: "Catalog", workspaces_dir: Path) -> None:
        self.uploads = uploads
        self.catalog = catalog
        self.workspaces_dir = workspaces_dir

    # -- inbound -----------------------------------------------------------------------
    def sees_images(self, handle: "AgentHandle", model: str = "") -> bool:
        """True when the model of this run takes image parts (known to the catalogue as such)."""
        chosen = self.catalog.get_model(model or handle.model)
        own = self.catalog.get_model(handle.model)
        return bool(chosen is not None and chosen.supports_vision and (own is None or own.supports_vision))

    def receive(self, hosts: set[str], handle: "AgentHandle", items: list[Attachment], limit: int,
                model: str = "") -> Received:
        out = Received()
        vision = self.sees_images(handle, model)
        for item in items:
            name = _safe_name(item.filename)
            try:
                data = self._bytes(item, hosts, limit)
                mime = sniff(data, item.content_type)
                declared = (item.content_type or "").split(";")[0].strip().lower()
                if declared.startswith("image/") and not mime.startswith("image/"):
                    raise FileRefused(f"it is not the image it claims to be (its bytes are {mime})")
                if not mime.startswith(UPLOAD_TYPES):
                    raise FileRefused(f"{mime} files are not accepted here (images, text, PDF and audio are)")
                saved = self.uploads.save_for(handle.id, name, mime, data)
                path = self._to_workspace(handle, name, data)
            except FileRefused as exc:
                out.refused.append(f"Sorry, I could not take {name}: {exc}.")
                continue
            except AgentdError as exc:
                out.refused.append(f"Sorry, I could not take {name}: {exc.message}.")
                continue
            where = f"saved as {path}, file_id {saved['file_id']}"
            if mime in MODEL_IMAGES and vision:
                out.images.append({"file_id": saved["file_id"]})
                out.notes.append(f"[image {name} ({mime}, {len(data)} bytes) attached; {where}]")
            elif mime.startswith("image/"):
                why = "this model cannot see images" if not vision else "the model is not shown this format"
                out.notes.append(f"[image {name} ({mime}, {len(data)} bytes) received; {where}; {why}]")
            else:
                out.notes.append(f"[file {name} ({mime}, {len(data)} bytes) received; {where}; "
                                 "read it with the file tools]")
        return out

    @staticmethod
    def _bytes(item: Attachment, hosts: set[str], limit: int) -> bytes:
        if item.size and item.size > limit:
            raise FileRefused(too_large(item.size, limit))
        if item.data is not None:
            if len(item.data) > limit:
                raise FileRefused(too_large(len(item.data), limit))
            data = item.data
        else:
            try:
                url = item.locate() if item.locate is not None else item.url
            except Exception as exc:  # noqa: BLE001 - the platform's failure, said to the sender
                raise FileRefused(f"the platform did not say where it is ({type(exc).__name__})") from None
            data = fetch(url, hosts, item.headers, limit)
            if item.open is not None:
                try:
                    data = item.open(data)
                except Exception as exc:  # noqa: BLE001 - whatever the platform's format rejects
                    raise FileRefused(f"it could not be opened ({type(exc).__name__})") from None
        if not data:
            raise FileRefused("it is empty")
        return data

    def workspace(self, handle: "AgentHandle") -> Path:
        return handle.workspace or self.workspaces_dir / handle.name

    def _to_workspace(self, handle: "AgentHandle", name: str, data: bytes) -> str:
        """A copy under inbox/ (a new name when one is taken: earlier files are kept)."""
        root = self.workspace(handle)
        folder = root / INBOX
        folder.mkdir(parents=True, exist_ok=True)
        if root.resolve() not in folder.resolve().parents:  # an inbox/ link out of the workspace
            raise FileRefused("the agent's inbox/ folder is not inside its workspace")
        stem, dot, ext = name.rpartition(".")
        if not stem:
            stem, dot, ext = name, "", ""
        candidate, n = name, 1
        while True:
            try:  # exclusive create: two conversations saving one name at once both keep theirs
                with open(folder / candidate, "xb") as out:
                    out.write(data)
                return f"{INBOX}/{candidate}"
            except FileExistsError:
                candidate = f"{stem}-{n}{dot}{ext}"
                n += 1

    # -- outbound ----------------------------------------------------------------------
    def outgoing(self, handle: "AgentHandle", result: "RunResult") -> list[Outgoing]:
        """The files this run made, in the order it made them."""
        args = {call.get("id"): call.get("arguments") or {} for call in result.tool_calls}
        found: list[Outgoing] = []
        seen: set[str] = set()
        for message in result.new_messages:
            if message.role != "tool" or message.is_error:
                continue
            if message.tool_name == "file_write":
                path = str(args.get(message.tool_call_id, {}).get("path") or "")
                item = self._output_file(handle, path)
                if item is not None and path not in seen:
                    seen.add(path)
                    found.append(item)
                continue
            for file_id in FILE_ID.findall(message.content or ""):
                if file_id in seen:
                    continue
                seen.add(file_id)
                try:
                    upload = self.uploads.read(handle, file_id)
                except AgentdError:
                    continue  # not this agent's file: never sent
                found.append(Outgoing(upload["filename"], upload["content_type"], upload["data"]))
        return found

    def _output_file(self, handle: "AgentHandle", path: str) -> Outgoing | None:
        if not path.startswith("output/"):
            return None
        root = self.workspace(handle).resolve()
        target = (root / path).resolve()
        if root / "output" not in target.parents or not target.is_file():
            return None
        data = target.read_bytes()
        if not data or len(data) > UPLOAD_LIMIT:
            return None
        return Outgoing(target.name, sniff(data, _guess_type(target.name)), data)


def _guess_type(name: str) -> str:
    import mimetypes

    return mimetypes.guess_type(name)[0] or ""


def _safe_name(name: str) -> str:
    base = re.sub(r"[\x00-\x1f/\\]", "_", (name or "").strip()).lstrip(".")[-120:]
    return base or "file"

