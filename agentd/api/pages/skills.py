"""The skills page: every skill of the home with its state (the JSON is GET /api/skills), and
the forms that install one (a folder on this machine, a zip URL or an uploaded zip), delete
one and scan the folder again, over the calls /api/skills makes."""

from __future__ import annotations

from flask import render_template, request, url_for

from agentd.api.pages import bp, form_post, kernel
from agentd.api.pages.confirm import ask_first
from agentd.api.pages.notes import see_other_with
from agentd.errors import AgentdError, BadRequest
from agentd.skills import MAX_ARCHIVE_BYTES


@bp.get("/skills")
def skills():
    listed = kernel().skills.list()
    return render_template("skills.html", skills=listed, valid=sum(1 for s in listed if s["valid"]))


@form_post("/skills/install", "pages.skills", keeps=("path", "url"))
def skill_install():
    """As POST /api/skills/install: the uploaded zip when one was chosen, else the URL, else the path."""
    service = kernel().skills
    path, url = request.form.get("path", "").strip(), request.form.get("url", "").strip()
    upload = request.files.get("file")
    try:
        if upload is not None and upload.filename:
            skill = service.install_zip(upload.read(MAX_ARCHIVE_BYTES + 1))
        elif url:
            skill = service.install_url(url)
        elif path:
            skill = service.install_path(path)
        else:
            raise BadRequest("give a folder on this machine, a zip's URL or a zip file")
    except AgentdError as exc:
        return see_other_with("pages.skills", [exc.message], ok=False, typed={"path": path, "url": url})
    said = "installed" if skill["valid"] else "installed but not valid: " + "; ".join(skill["errors"])
    return see_other_with("pages.skills", [f"skill {skill['name']} {said}"], ok=skill["valid"])


@bp.route("/skills/delete", methods=["GET", "POST"])
def skill_delete():
    name = request.values.get("name", "")
    asked = ask_first(f"Delete skill {name}?", "Its folder is deleted from the skills folder and agents can no "
                      "longer use it. This cannot be undone.", f"Delete {name}", url_for("pages.skills"))
    if asked is not None:
        return asked
    try:
        kernel().skills.delete(name)
    except AgentdError as exc:
        return see_other_with("pages.skills", [exc.message], ok=False)
    return see_other_with("pages.skills", [f"skill {name} deleted"])


@form_post("/skills/reload", "pages.skills")
def skills_reload():
    listed = kernel().skills.reload()
    valid = sum(1 for s in listed if s["valid"])
    return see_other_with("pages.skills", [f"skills folder read again: {valid} of {len(listed)} valid"])
