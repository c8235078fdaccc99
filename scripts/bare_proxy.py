#!/usr/bin/env python3
"""The ceiling of agentd's stack: a bare Flask + waitress + requests pass-through proxy.

`POST /v1/chat/completions` forwards the body to the upstream with a keep-alive
`requests.Session` per thread (as agentd's drivers do) and returns the answer; a
streamed answer is passed through chunk by chunk. Same waitress settings as agentd's
defaults, so a benchmark compares agentd's own work with nothing else.

    python scripts/bare_proxy.py PORT UPSTREAM_BASE_URL
"""

from __future__ import annotations

import sys
import threading

import requests
import waitress
from flask import Flask, Response, request

_local = threading.local()


def session() -> requests.Session:
    s = getattr(_local, "session", None)
    if s is None:
        s = _local.session = requests.Session()
        s.trust_env = False
    return s


def build(upstream: str) -> Flask:
    app = Flask("bare")
    url = f"{upstream.rstrip('/')}/chat/completions"

    @app.post("/v1/chat/completions")
    def chat() -> Response:
        data = request.get_data()
        stream = b'"stream": true' in data or b'"stream":true' in data
        answer = session().post(url, data=data, headers={"Content-Type": "application/json"},
                                stream=stream, timeout=(10, 120))
        if not stream:
            return Response(answer.content, status=answer.status_code, content_type="application/json")

        def relay():
            try:
                yield from answer.iter_content(chunk_size=None)
            finally:
                answer.close()

        return Response(relay(), status=answer.status_code, content_type="text/event-stream")

    return app


if __name__ == "__main__":
    waitress.serve(build(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), threads=128,
                   connection_limit=1000, asyncore_use_poll=True, channel_timeout=300, _quiet=True)
