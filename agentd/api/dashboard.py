"""The server-rendered dashboard at `/`."""

from __future__ import annotations

from flask import Blueprint, current_app, render_template

from agentd.api.middleware import is_authorized

bp = Blueprint("dashboard", __name__)


@bp.get("/")
def index():
    k = current_app.extensions["agentd.kernel"]
    # The shell is public; what the daemon holds is shown only to callers the
    # API itself would serve.
    authorized = is_authorized(k.config)
    status = k.status() if authorized else None
    response = current_app.make_response(render_template("index.html", status=status,
                                                          authorized=authorized))
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
    return response


@bp.get("/favicon.ico")
def favicon():
    return current_app.send_static_file("favicon.svg")
