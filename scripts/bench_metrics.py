#!/usr/bin/env python3
"""What metrics add to one message, in-process: the observations a plain message makes
(its HTTP request, its run, one model call with its usage) and a scrape, timed with
timeit on the real `Metrics` and `RequestMetrics` classes, in CPU time (other processes on
a busy machine move wall-clock figures more than these). Figures only.

    python scripts/bench_metrics.py [--number 200000]
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentd.api.metrics_http import RequestMetrics  # noqa: E402
from agentd.metrics import Metrics  # noqa: E402


class Rule:
    rule = "/api/agents/<agent_id>/message"


class Request:
    url_rule = Rule()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()
    metrics = Metrics(budget=lambda: {"spent_usd": 1.5, "limit_usd": 10.0},
                      queues=lambda: [(f"a{i}", 0) for i in range(64)])

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b"{}"]

    wrapped = RequestMetrics(app, metrics)
    environ = {"REQUEST_METHOD": "POST", "werkzeug.request": Request()}

    def start_response(status, headers, exc_info=None):
        return None

    def message() -> None:
        metrics.run_finished("api", "completed", 0.01, "a1")
        metrics.llm_call("openai", "gpt-4o", "ok", 0.01)
        metrics.usage("openai", "gpt-4o", 120, 30, 0.0005)

    n = args.number
    for name, stmt in (("bare WSGI app", lambda: app(environ, start_response)),
                       ("app + RequestMetrics", lambda: wrapped(environ, start_response)),
                       ("run + model call + usage", message)):
        seconds = min(timeit.repeat(stmt, number=n, repeat=5, timer=time.process_time))
        print(f"{name:28s} {seconds / n * 1e6:7.2f} µs")
    scrape = min(timeit.repeat(metrics.exposition, number=200, repeat=5, timer=time.process_time)) / 200
    print(f"{'scrape (64 agents)':28s} {scrape * 1e3:7.2f} ms, {len(metrics.exposition())} bytes")


if __name__ == "__main__":
    main()
