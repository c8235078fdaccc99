"""The skills page: every skill of the home with its state (the JSON is GET /api/skills)."""

from __future__ import annotations

from flask import render_template

from agentd.api.pages import bp, kernel


@bp.get("/skills")
def skills():
    listed = kernel().skills.list()
    return render_template("skills.html", skills=listed, valid=sum(1 for s in listed if s["valid"]))
