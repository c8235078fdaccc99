"""Where a job's result goes: a channel (through the adapter's sender) or a signed webhook.

A delivery runs after the agent's run ended and never runs the agent again: a failed
attempt is recorded on the run (`delivery: {status, attempts, error}`) and retried with
backoff (agentd/retry.py) up to `[schedules] delivery_attempts`. A delivery a stopped daemon
left unfinished is resumed by the next daemon to start (Scheduler.start).

Webhook: `POST <url>` with the JSON body `{"job": {id, name, agent_id}, "run": {id, status,
started_at, finished_at, cost_usd}, "output": "..."}` and `X-Agentd-Signature:
sha256=<hex HMAC-SHA256 of the body>` under the secret in the environment variable the job's
`secret_env` names. Any 2xx answer is delivered.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Callable, Mapping

from agentd import hmacs
from agentd.retry import Backoff

log = logging.getLogger("agentd.schedules")

SIGNATURE_HEADER = "X-Agentd-Signature"
TIMEOUT_SECS = 10.0


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmacs.hex_digest(secret, body)


def unset_secret(target: dict[str, Any], environ: Mapping[str, str] = os.environ) -> str:
    """The variable a webhook delivery's `secret_env` names when `environ` does not hold it
    (every delivery would fail), else ""."""
    name = target.get("secret_env") or "" if target.get("kind") == "webhook" else ""
    return name if name and not environ.get(name) else ""


class Delivery:
    """`send_channel(name, text, target)` is the channel manager's sender; `record(run_id,
    state)` writes the run's delivery state."""

    def __init__(self, send_channel: Callable[[str, str, str], Any], record: Callable[[str, dict[str, Any]], None],
                 attempts: int, stopping: threading.Event, initial_delay: float = 1.0,
                 max_delay: float = 60.0) -> None:
        self.send_channel = send_channel
        self.record = record
        self.attempts = attempts
        self.stopping = stopping
        self.initial_delay = initial_delay
        self.max_delay = max_delay

    @staticmethod
    def pending(job: dict[str, Any]) -> dict[str, Any] | None:
        """The run's delivery state before the first attempt; None for a job without delivery."""
        if job["delivery"].get("kind", "none") == "none":
            return None
        return {"status": "pending", "attempts": 0, "error": None}

    def start(self, job: dict[str, Any], run: dict[str, Any], output: str, done: int = 0) -> None:
        """Begin delivering, on a thread of its own, after `done` attempts made already. Called
        once the run's `pending` state is stored: each attempt records its outcome over it,
        never the other way round."""
        thread = threading.Thread(target=self._deliver, args=(job["delivery"], job, run, output, done),
                                  name=f"agentd-cron-delivery-{run['id'][:8]}", daemon=True)
        thread.start()

    def resume(self, job: dict[str, Any], run: dict[str, Any]) -> None:
        """Go on with the delivery of a stored run that a stopped daemon left `pending` or
        `retrying`: its stored output, to the job's delivery, counting the attempts on."""
        state = run["delivery"]
        if self.pending(job) is None:
            self.record(run["id"], {**state, "status": "failed", "error": "the job's delivery was removed"})
        elif state["attempts"] >= self.attempts:  # `delivery_attempts` lowered since
            self.record(run["id"], {**state, "status": "failed"})
        else:
            self.start(job, run, run["output"] or "", state["attempts"])

    def _deliver(self, target: dict[str, Any], job: dict[str, Any], run: dict[str, Any], output: str,
                 done: int) -> None:
        try:
            self._attempts(target, job, run, output, done)
        except Exception as exc:  # noqa: BLE001 - e.g. the database closed by a shutdown meanwhile
            log.warning("cron job %s: delivery state not recorded: %s", job["name"], exc)

    def _attempts(self, target: dict[str, Any], job: dict[str, Any], run: dict[str, Any], output: str,
                  done: int) -> None:
        backoff = Backoff(self.initial_delay, self.max_delay)
        error = ""
        for attempt in range(done + 1, self.attempts + 1):
            try:
                self._send_once(target, job, run, output)
            except Exception as exc:  # noqa: BLE001 - every failure is recorded and retried
                error = (getattr(exc, "message", None) or str(exc) or type(exc).__name__)[:500]
                last = attempt == self.attempts
                self.record(run["id"], {"status": "failed" if last else "retrying", "attempts": attempt,
                                        "error": error})
                log.warning("cron job %s: delivery attempt %d failed: %s", job["name"], attempt, error)
                if last or backoff.wait(self.stopping):
                    return
                continue
            self.record(run["id"], {"status": "delivered", "attempts": attempt, "error": None})
            return

    def _send_once(self, target: dict[str, Any], job: dict[str, Any], run: dict[str, Any], output: str) -> None:
        if target["kind"] == "channel":
            self.send_channel(target["channel"], output, target.get("chat_id", ""))
            return
        import requests

        missing = unset_secret(target)
        if missing:
            raise RuntimeError(f"the environment variable {missing} (secret_env) is not set")
        secret = os.environ.get(target.get("secret_env") or "", "")
        body = json.dumps({"job": {"id": job["id"], "name": job["name"], "agent_id": job["agent_id"] or None},
                           "run": {key: run.get(key) for key in ("id", "status", "started_at", "finished_at",
                                                                "cost_usd")},
                           "output": output}, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json", "User-Agent": "agentd-cron"}
        if secret:
            headers[SIGNATURE_HEADER] = signature(secret, body)
        response = requests.post(target["url"], data=body, headers=headers, timeout=TIMEOUT_SECS,
                                 allow_redirects=False)
        if not 200 <= response.status_code < 300:
            raise RuntimeError(f"webhook answered HTTP {response.status_code}")
