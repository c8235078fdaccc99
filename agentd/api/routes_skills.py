"""Skills: list, install (a local folder, an allowed URL or a zip upload), delete, reload."""

from __future__ import annotations

from flask import Blueprint, jsonify, request
from werkzeug.routing import BaseConverter

from agentd.api import body
from agentd.api.apidoc import doc
from agentd.api.routes_system import kernel
from agentd.api.schemas_skills import SKILL, SKILL_DELETED, SKILL_LIST, SkillInstallSchema
from agentd.errors import BadRequest
from agentd.skills import MAX_ARCHIVE_BYTES, RESERVED_NAMES

bp = Blueprint("skills", __name__)


class SkillNameConverter(BaseConverter):
    """A skill's name in a path, never one of the routes beside it (so OPTIONS on
    /api/skills/install lists only what that route serves)."""

    regex = r"(?!(?:" + "|".join(RESERVED_NAMES) + r")$)[^/]+"


bp.record_once(lambda state: state.app.url_map.converters.setdefault("skill_name", SkillNameConverter))


@bp.get("/api/skills")
@doc("Installed skills, valid or not", tags="skills", response=SKILL_LIST)
def list_skills():
    return jsonify(kernel().skills.list())


@bp.post("/api/skills/install")
@doc("Install a skill", tags="skills", body=SkillInstallSchema, ok=201, response=SKILL,
     body_example={"path": "/home/me/skills/release-notes"},
     description="From a folder on this machine (`path`), from a zip archive at a URL whose host is "
                 "in `[tools] fetch_allow_hosts` (`url`), or from a zip uploaded as the `file` part of a "
                 "multipart/form-data body. The archive holds SKILL.md at its top or in one top folder; "
                 "entries that leave the folder, symbolic links and archives over 10 MB (20 MB unpacked) "
                 "are refused.",
     errors={400: "Not a skill (no SKILL.md, bad front matter), a path outside the folder, or a URL "
                  "host that is not allowed", 409: "A skill of that name is installed",
             413: "Archive or folder too large"})
def install():
    skills = kernel().skills
    if request.mimetype == "multipart/form-data":
        body.raw_body(MAX_ARCHIVE_BYTES + 64 * 1024)
        upload = request.files.get("file")
        if upload is None:
            raise BadRequest("no file provided: send the zip as a multipart part named 'file'")
        return jsonify(skills.install_zip(upload.read(MAX_ARCHIVE_BYTES + 1))), 201
    data = body.load(SkillInstallSchema())
    if "path" in data:
        return jsonify(skills.install_path(data["path"])), 201
    return jsonify(skills.install_url(data["url"])), 201


@bp.delete("/api/skills/<skill_name:name>")
@doc("Delete an installed skill", tags="skills", response=SKILL_DELETED,
     path_params={"name": {"description": "Skill name (as listed by GET /api/skills)"}})
def delete(name: str):
    kernel().skills.delete(name)
    return jsonify({"status": "removed", "name": name})


@bp.post("/api/skills/reload")
@doc("Scan the skills folder again", tags="skills", response=SKILL_LIST)
def reload():
    return jsonify(kernel().skills.reload())
