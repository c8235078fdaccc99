"""The HTTP layer: a Flask application factory and its blueprints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from flask import Flask

from agentd.api.errors import register_error_handlers
from agentd.api.guard import install_guard
from agentd.api.middleware import install_middleware
from agentd.api.proxy import install_proxy_headers
from agentd.kernel import Kernel


def _asset_dir(name: str) -> str:
    """templates/ and static/ live at the repo top level; installs copy them to share/agentd."""
    source = Path(__file__).resolve().parents[2] / name
    if source.is_dir():
        return str(source)
    return str(Path(sys.prefix) / "share" / "agentd" / name)


def create_app(kernel: Kernel, pool_stats: Callable[[], dict] | None = None) -> Flask:
    """Build the Flask app serving `kernel`."""
    app = Flask("agentd", template_folder=_asset_dir("templates"),
                static_folder=_asset_dir("static"), static_url_path="/static")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config["MAX_CONTENT_LENGTH"] = 16 * 1024 * 1024
    app.extensions["agentd.kernel"] = kernel
    app.extensions["agentd.pool_stats"] = pool_stats or (lambda: {})

    from agentd.api import (pages, routes_agents, routes_catalog, routes_memory, routes_openai,
                            routes_stream, routes_system, routes_workflows)
    from agentd.api.sockets import register_sockets

    install_middleware(app, kernel.config)
    install_guard(app, kernel.config)
    register_error_handlers(app)
    app.register_blueprint(routes_system.bp)
    app.register_blueprint(routes_agents.bp)
    app.register_blueprint(routes_memory.bp)
    app.register_blueprint(routes_stream.bp)
    app.register_blueprint(routes_openai.bp)
    app.register_blueprint(routes_catalog.bp)
    app.register_blueprint(routes_workflows.bp)
    app.register_blueprint(pages.bp)
    from agentd.api import routes_docs
    app.register_blueprint(routes_docs.bp)
    from agentd.api import routes_channels
    app.register_blueprint(routes_channels.bp)
    from agentd.api import routes_cluster
    app.register_blueprint(routes_cluster.bp)
    register_sockets(app)
    # Outermost: the guard, rate limiter, auth and logs see the real client.
    install_proxy_headers(app, kernel.config.api.trusted_proxies)
    return app
