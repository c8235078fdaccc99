"""The HTTP layer: a Flask application factory and its blueprints.

Importing the package is cheap (Flask and the kernel load in `create_app`): the daemon
listens and answers its liveness probe while they load (agentd/server/startgate.py).
The app owns what serving needs beside the kernel: the stream slots and the trusted
proxies (agentd/server/).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from flask import Flask

    from agentd.kernel import Kernel


def _asset_dir(name: str) -> str:
    """templates/ and static/ live at the repo top level; installs copy them to share/agentd."""
    source = Path(__file__).resolve().parents[2] / name
    if source.is_dir():
        return str(source)
    return str(Path(sys.prefix) / "share" / "agentd" / name)


def create_app(kernel: Kernel, pool_stats: Callable[[], dict] | None = None, limiter: Any = None) -> Flask:
    """Build the Flask app serving `kernel` (`limiter`: the rate limiter the start gate
    already counted requests with, so the budget is one from the first request on)."""
    from flask import Flask, request
    from werkzeug.routing import Rule

    from agentd import tracing
    from agentd.api.errors import register_error_handlers
    from agentd.api.guard import install_guard
    from agentd.api.json_provider import CachedEncoderProvider
    from agentd.api.middleware import install_middleware
    from agentd.server.forwarded import TrustedProxies, real_client
    from agentd.server.proxy import install_proxy_headers
    from agentd.server.slots import Slots

    class LazyBuilderRule(Rule):
        """Werkzeug compiles two URL builders per route as the route is added (Python source
        generated and compiled for each), a large part of the daemon's start, for builders
        the API never asks for. Each is compiled the first time it builds a URL instead."""

        def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
            compile_builder = super()._compile_builder
            compiled: list[Callable[..., tuple[str, str]]] = []

            def build(rule: Rule, *args: Any, **kwargs: Any) -> tuple[str, str]:
                if not compiled:  # two first uses at once compile the same builder twice
                    compiled.append(compile_builder(append_unknown))
                return compiled[0](rule, *args, **kwargs)

            return build

    class AgentdFlask(Flask):
        json_provider_class = CachedEncoderProvider
        url_rule_class = LazyBuilderRule
        _sync: dict[Callable, Callable] | None = None  # a hook or view -> what Flask calls

        def ensure_sync(self, func: Callable) -> Callable:
            """Flask asks, for every hook and view on every request, whether it is a
            coroutine function (an `inspect` call each, nine a message): ask once."""
            if self._sync is None:
                self._sync = {}
            known = self._sync.get(func)
            if known is None:
                known = self._sync[func] = super().ensure_sync(func)
            return known

    app = AgentdFlask("agentd", template_folder=_asset_dir("templates"),
                static_folder=_asset_dir("static"), static_url_path="/static")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config["MAX_CONTENT_LENGTH"] = 16 * 1024 * 1024
    app.extensions["agentd.kernel"] = kernel
    app.extensions["agentd.pool_stats"] = pool_stats or (lambda: {})
    if limiter is not None:
        app.extensions["agentd.limiter"] = limiter
    # Long-lived requests (SSE, WebSocket, a message waiting for its run) each hold a
    # server thread; capping them keeps threads free for plain HTTP.
    app.extensions["agentd.stream_slots"] = Slots(kernel.config.api.max_streams)
    trusted = TrustedProxies(kernel.config.api.trusted_proxies)
    # The channels' webhook listeners name the client behind the same proxies.
    kernel.channels.client_of = lambda peer, header: real_client(peer, header, trusted)

    from agentd.api import (pages, routes_agents, routes_catalog, routes_memory, routes_openai,
                            routes_stream, routes_system, routes_workflows)
    from agentd.api.sockets import register_sockets

    if kernel.config.metrics.enabled:
        from agentd.api.metrics_http import RequestMetrics

        # Inside the common headers: the request id is set and the answer's own status is seen.
        app.wsgi_app = RequestMetrics(app.wsgi_app, kernel.metrics,  # type: ignore[method-assign]
                                      kernel.agents.registry.loaded_handle)
    # Every answer names the daemon that gave it (agentd/api/routes_cluster.py).
    install_middleware(app, kernel.config, fixed_headers=[("X-Agentd-Daemon", kernel.cluster.id)])
    install_guard(app, kernel.config)
    register_error_handlers(app)
    app.register_blueprint(routes_system.bp)
    app.register_blueprint(routes_agents.bp)
    app.register_blueprint(routes_memory.bp)
    app.register_blueprint(routes_stream.bp)
    app.register_blueprint(routes_openai.bp)
    from agentd.api import routes_embeddings, routes_responses
    app.register_blueprint(routes_responses.bp)
    app.register_blueprint(routes_embeddings.bp)
    app.register_blueprint(routes_catalog.bp)
    app.register_blueprint(routes_workflows.bp)
    app.register_blueprint(pages.bp)
    from agentd.api import routes_docs
    app.register_blueprint(routes_docs.bp)
    from agentd.api import routes_channels
    app.register_blueprint(routes_channels.bp)
    from agentd.api import routes_cluster
    app.register_blueprint(routes_cluster.bp)
    from agentd.api import routes_mcp
    app.register_blueprint(routes_mcp.bp)
    if kernel.config.metrics.enabled:
        from agentd.api import routes_metrics
        app.register_blueprint(routes_metrics.bp)
    from agentd.api import routes_tasks, routes_triggers
    app.register_blueprint(routes_triggers.bp)
    app.register_blueprint(routes_tasks.bp)
    from agentd.api import routes_tools, routes_uploads
    app.register_blueprint(routes_tools.bp)
    app.register_blueprint(routes_uploads.bp)
    from agentd.api import routes_a2a, routes_skills
    app.register_blueprint(routes_a2a.bp)
    app.register_blueprint(routes_skills.bp)
    from agentd.api import routes_cron
    app.register_blueprint(routes_cron.bp)
    from agentd.api import routes_keys
    app.register_blueprint(routes_keys.bp)
    from agentd.api import routes_webhooks
    app.register_blueprint(routes_webhooks.bp)
    register_sockets(app)
    # Outermost: the guard, rate limiter, auth and logs see the real client.
    install_proxy_headers(app, trusted)
    if tracing.enabled():
        def _name_span() -> None:
            tracing.name_request(request.method, request.url_rule.rule if request.url_rule is not None else None)

        # First of the hooks: a request the auth hook refuses is named by its route too.
        app.before_request_funcs.setdefault(None, []).insert(0, _name_span)
        app.wsgi_app = tracing.wsgi(app.wsgi_app)  # type: ignore[method-assign]
    return app
