"""Skills: folders with a `SKILL.md` (YAML front matter `name` and `description`, then the
instructions) and optional files, kept in `$AGENTD_HOME/skills/`.

Agents see one line per permitted skill in their system prompt and load the instructions on
demand (agentd/agents/tools/skills.py), so the prompt does not grow with every skill. A
skill's files are read-only to agents and nothing outside its folder is ever read.
"""

from __future__ import annotations

import io
import re
import shutil
import stat
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from agentd.errors import BadRequest, Conflict, NotFound, PayloadTooLarge

SKILL_FILE = "SKILL.md"
NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
MAX_DESCRIPTION = 1024
# Names of the routes beside DELETE /api/skills/{name}; no skill can have them.
RESERVED_NAMES = ("install", "reload")
# Install caps: an archive (or a folder) larger than this is refused, not truncated.
MAX_ARCHIVE_BYTES = 10 * 1024 * 1024
MAX_UNPACKED_BYTES = 20 * 1024 * 1024
MAX_FILES = 500
# What one tool call may read of a skill's file.
MAX_READ_BYTES = 256 * 1024
_STAGING = ".installing-"


@dataclass(frozen=True)
class Skill:
    """One folder of the skills directory, valid or not (`errors` say why not)."""

    name: str
    description: str
    path: Path
    body: str = ""
    files: tuple[str, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)

    @property
    def valid(self) -> bool:
        return not self.errors

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "path": str(self.path),
                "files": list(self.files), "valid": self.valid, "errors": list(self.errors)}


def parse_skill_md(text: str) -> tuple[dict[str, Any], str, list[str]]:
    """(front matter, body, errors) of a SKILL.md text."""
    import yaml

    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, text, ["SKILL.md must start with YAML front matter between '---' lines"]
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        return {}, text, ["SKILL.md front matter is not closed by a '---' line"]
    try:
        meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return {}, text, [f"SKILL.md front matter is not valid YAML: {first}"]
    except RecursionError:  # PyYAML's composer recurses once per nested collection
        return {}, text, ["SKILL.md front matter is nested too deeply"]
    if not isinstance(meta, dict):
        return {}, text, ["SKILL.md front matter must be a mapping (name: ..., description: ...)"]
    errors = []
    name = meta.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        errors.append("front matter 'name' must be 1-64 lowercase letters, digits and hyphens "
                      "(not starting or ending with a hyphen)")
    elif name in RESERVED_NAMES:
        errors.append(f"front matter 'name' cannot be '{name}' (reserved)")
    description = meta.get("description")
    if not isinstance(description, str) or not description.strip():
        errors.append("front matter 'description' must be a non-empty string")
    elif len(description) > MAX_DESCRIPTION:
        errors.append(f"front matter 'description' is longer than {MAX_DESCRIPTION} characters")
    return meta, "\n".join(lines[end + 1:]).strip("\n"), errors


def load_skill(folder: Path) -> Skill:
    """The skill in `folder` (never raises: problems become the skill's errors)."""
    skill_md = folder / SKILL_FILE
    if not skill_md.is_file():
        return Skill(folder.name, "", folder, errors=(f"no {SKILL_FILE} in the folder",))
    try:
        text = skill_md.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return Skill(folder.name, "", folder, errors=(f"{SKILL_FILE} cannot be read: {type(exc).__name__}",))
    meta, body, errors = parse_skill_md(text)
    if not errors and meta["name"] != folder.name:
        errors.append(f"front matter name '{meta['name']}' does not match its folder '{folder.name}'")
    description = meta.get("description") if isinstance(meta.get("description"), str) else ""
    try:
        files = tuple(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                             if p.is_file() and not p.is_symlink()))
    except OSError as exc:
        errors.append(f"the folder cannot be listed: {type(exc).__name__}")
        files = ()
    # Named by its folder, valid or not: an invalid SKILL.md naming another skill never
    # stands in for that skill (in the listing, for agents, for a delete).
    return Skill(folder.name, " ".join(description.split()), folder, body, files, tuple(errors))


def confined(folder: Path, relative: str) -> Path:
    """`relative` inside `folder`, or BadRequest: no absolute paths, no way out, no links out."""
    if not relative or relative.startswith(("/", "\\")) or "\\" in relative or "\x00" in relative:
        raise BadRequest(f"'{relative}' is not a relative path inside the skill")
    root = folder.resolve()
    target = (root / relative).resolve()
    if not target.is_relative_to(root) or target == root:
        raise BadRequest(f"'{relative}' is outside the skill's folder")
    return target


def read_file(skill: Skill, relative: str) -> str:
    """A file of the skill, as text (read-only; confined to its folder)."""
    target = confined(skill.path, relative)
    if not target.is_file():
        raise NotFound(f"skill '{skill.name}' has no file '{relative}'")
    with target.open("rb") as fh:
        data = fh.read(MAX_READ_BYTES + 1)
    text = data[:MAX_READ_BYTES].decode("utf-8", errors="replace")
    return text + (f"\n[truncated at {MAX_READ_BYTES} bytes]" if len(data) > MAX_READ_BYTES else "")


class Skills:
    """The skills directory: scanned at start and on reload, changed by install and delete."""

    def __init__(self, root: Path, fetch_allow_hosts: list[str] | None = None, fetch_timeout: float = 30.0) -> None:
        self.root = root
        self.allow_hosts = {h.lower() for h in fetch_allow_hosts or []}
        self.fetch_timeout = fetch_timeout
        self._lock = threading.Lock()
        self._skills: dict[str, Skill] = {}
        self.reload()

    # -- reading ----------------------------------------------------------------
    def reload(self) -> list[dict[str, Any]]:
        """Scan the directory again; the listing."""
        found: dict[str, Skill] = {}
        if self.root.is_dir():
            for folder in sorted(self.root.iterdir()):
                if folder.is_dir() and not folder.name.startswith("."):
                    skill = load_skill(folder)
                    found[skill.name] = skill
        with self._lock:
            self._skills = found
        return self.list()

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [s.record() for s in self._skills.values()]

    def get(self, name: str) -> Skill:
        with self._lock:
            skill = self._skills.get(name)
        if skill is None:
            raise NotFound(f"no skill named '{name}'")
        return skill

    def permitted(self, allowed: list[str] | tuple[str, ...] | None) -> list[Skill]:
        """The valid skills an agent's `skills` allow-list permits (empty: all)."""
        with self._lock:
            skills = [s for s in self._skills.values() if s.valid]
        return [s for s in skills if not allowed or s.name in allowed]

    # -- changing ---------------------------------------------------------------
    def install_path(self, source: str) -> dict[str, Any]:
        """Copy a skill folder from this machine's disk (symbolic links are refused)."""
        folder = Path(source)
        if "\x00" in source or not folder.is_absolute():
            raise BadRequest("path must be an absolute path to a skill folder")
        try:
            if not folder.is_dir():
                raise BadRequest(f"no folder at {source}")
            if not (folder / SKILL_FILE).is_file():
                raise BadRequest(f"{source} has no {SKILL_FILE}")
            total, count = 0, 0
            for p in folder.rglob("*"):
                if p.is_symlink():
                    raise BadRequest(f"symbolic links are not installed: {p.relative_to(folder).as_posix()}")
                if p.is_file():
                    count += 1
                    total += p.stat().st_size
                    self._check_size(total, count)
            staging = self._staging()
            try:
                shutil.copytree(folder, staging, dirs_exist_ok=True)
                return self._commit(staging)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        except (OSError, shutil.Error) as exc:
            raise BadRequest(f"cannot read the skill folder {source}: {type(exc).__name__}") from None

    def install_zip(self, data: bytes) -> dict[str, Any]:
        """Unpack a zip holding SKILL.md at its top or in its one top folder."""
        if len(data) > MAX_ARCHIVE_BYTES:
            raise PayloadTooLarge(f"skill archive too large (max {MAX_ARCHIVE_BYTES // (1024 * 1024)} MB)")
        import zipfile  # (with its compression modules: only for an install)

        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except zipfile.BadZipFile:
            raise BadRequest("the upload is not a zip archive") from None
        with archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            for m in members:
                parts = PurePosixPath(m.filename.replace("\\", "/")).parts
                if m.filename.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
                    raise BadRequest(f"archive entry '{m.filename}' points outside the skill folder")
                if stat.S_ISLNK(m.external_attr >> 16):
                    raise BadRequest(f"archive entry '{m.filename}' is a symbolic link")
            self._check_size(sum(m.file_size for m in members), len(members))
            prefix = self._archive_prefix([m.filename.replace("\\", "/") for m in members])
            staging = self._staging()
            try:
                written = 0
                for m in members:
                    relative = m.filename.replace("\\", "/")[len(prefix):]
                    if not relative:
                        continue
                    target = confined(staging, relative)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(m) as src, target.open("wb") as dst:
                        while chunk := src.read(65536):
                            written += len(chunk)
                            # The sizes an archive declares can lie; what is written is counted.
                            if written > MAX_UNPACKED_BYTES:
                                raise PayloadTooLarge("skill archive unpacks to more than "
                                                      f"{MAX_UNPACKED_BYTES // (1024 * 1024)} MB")
                            dst.write(chunk)
                return self._commit(staging)
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def install_url(self, url: str) -> dict[str, Any]:
        """Download a zip, only from a host listed in [tools] fetch_allow_hosts."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or not host:
            raise BadRequest("url must be an http or https URL")
        if host not in self.allow_hosts:
            raise BadRequest(f"installing from {host} is not allowed: add the host to [tools] fetch_allow_hosts")
        import requests

        try:
            with requests.get(url, stream=True, timeout=self.fetch_timeout, allow_redirects=False) as response:
                if response.status_code != 200:
                    raise BadRequest(f"downloading the skill failed: HTTP {response.status_code}")
                data = bytearray()
                for chunk in response.iter_content(65536):
                    data += chunk
                    if len(data) > MAX_ARCHIVE_BYTES:
                        raise PayloadTooLarge(f"skill archive too large (max {MAX_ARCHIVE_BYTES // (1024 * 1024)} MB)")
        except requests.RequestException as exc:
            raise BadRequest(f"downloading the skill failed: {type(exc).__name__}") from None
        return self.install_zip(bytes(data))

    def delete(self, name: str) -> None:
        skill = self.get(name)
        shutil.rmtree(skill.path, ignore_errors=True)
        with self._lock:
            self._skills.pop(name, None)

    # -- helpers ----------------------------------------------------------------
    @staticmethod
    def _check_size(total: int, count: int) -> None:
        if count > MAX_FILES:
            raise PayloadTooLarge(f"a skill may hold at most {MAX_FILES} files")
        if total > MAX_UNPACKED_BYTES:
            raise PayloadTooLarge(f"skill too large (max {MAX_UNPACKED_BYTES // (1024 * 1024)} MB unpacked)")

    @staticmethod
    def _archive_prefix(names: list[str]) -> str:
        if SKILL_FILE in names:
            return ""
        tops = {n.split("/", 1)[0] for n in names}
        if len(tops) == 1 and f"{next(iter(tops))}/{SKILL_FILE}" in names:
            return next(iter(tops)) + "/"
        raise BadRequest(f"the archive has no {SKILL_FILE} at its top or in its one top folder")

    def _staging(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f"{_STAGING}{uuid.uuid4().hex}"
        staging.mkdir()
        return staging

    def _commit(self, staging: Path) -> dict[str, Any]:
        try:
            text = (staging / SKILL_FILE).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise BadRequest(f"invalid skill: {SKILL_FILE} is not UTF-8 text") from None
        meta, _, errors = parse_skill_md(text)
        if errors:
            raise BadRequest("invalid skill: " + "; ".join(errors))
        name = meta["name"]
        with self._lock:
            target = self.root / name
            if target.exists():
                raise Conflict(f"a skill named '{name}' is already installed (delete it first)")
            staging.rename(target)
            skill = load_skill(target)
            self._skills[skill.name] = skill
        return skill.record()


def prompt_lines(skills: list[Skill]) -> str:
    """The system prompt's part about skills: one line each, the instructions left out."""
    lines = [f"- {s.name}: {s.description}" for s in skills]
    return ("Skills you can use (read one's instructions with skill_describe before following it):\n"
            + "\n".join(lines))


def check_home(root: Path) -> list[tuple[str, list[str]]]:
    """`agentd doctor`: (folder name, errors) for every skill folder of `root`."""
    if not root.is_dir():
        return []
    return [(folder.name, list(load_skill(folder).errors)) for folder in sorted(root.iterdir())
            if folder.is_dir() and not folder.name.startswith(".")]
