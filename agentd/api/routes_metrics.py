"""GET /metrics: the Prometheus text format (agentd/metrics.py), behind the API's auth."""

from __future__ import annotations

from flask import Blueprint, Response, current_app

from agentd.api.apidoc import doc

bp = Blueprint("metrics", __name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@bp.get("/metrics")
@doc("Prometheus metrics", tags="system", response={"type": "string"}, response_media="text/plain",
     description="The daemon's metrics in the Prometheus text exposition format: requests, runs, "
                 "model calls, tokens and cost, budget, queues, refusals, streams, channels, memory "
                 "recall and scheduler lag (docs/metrics.md lists every series). Served when "
                 "`[metrics] enabled` is true; authenticated like the rest of the API.")
def metrics():
    body = current_app.extensions["agentd.kernel"].metrics.exposition()
    return Response(body, mimetype=None, content_type=CONTENT_TYPE)
