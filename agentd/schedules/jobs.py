"""Cron jobs as the API, the tools, the CLI and the dashboard see them: validation, create,
list, read, change, delete (firing is agentd/schedules/scheduler.py).

A job (`POST /api/cron/jobs`):

    {"name", "agent_id" (id or name), "schedule": {kind: cron|every|at, ...},
     "action": {kind: agent_turn, message} | {kind: workflow_run, workflow_id, input},
     "delivery": {kind: none} | {kind: channel, channel, chat_id?} | {kind: webhook, url, secret_env},
     "enabled", "one_shot", "catch_up": skip|once, "max_runs_per_day", "max_cost_usd_per_day"}

Every 400 names the field at fault. An agent or workflow outside a scoped key's list is
refused in the words an unknown one gets. Creating, changing and deleting a job is audited
(`cron.create`, `cron.update`, `cron.delete`) with who did it: `by` is the scoped key's name
(and `key_id` its id) or `admin`. A scoped key that changes what a job does (its agent,
action or delivery) makes the job its own: its runs act as the key from then on.
"""

from __future__ import annotations

import ipaddress
import re
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

from agentd.agents.handle import MESSAGE_LIMIT
from agentd.config import SchedulesConfig
from agentd.env_names import confined
from agentd.errors import BadRequest, NotFound
from agentd.http_urls import usable_http_url
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.principals import ADMIN, Principal
from agentd.schedules.delivery import unset_secret
from agentd.schedules.spec import parse_schedule, schedule_from_json
from agentd.schedules.store import RUN_RETENTION, CronStore

if TYPE_CHECKING:
    from agentd.key_runs import KeyRuns

Audit = Callable[[str, str, dict[str, Any]], None]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.:@-]{0,127}$")
CATCH_UP = ("skip", "once")
# The fields that say what a job does: a scoped key changing one makes the job the key's.
OWNED = {"agent_id", "action", "delivery"}
# The variables a scoped key's webhook delivery may sign with (agentd/env_names.py).
WEBHOOK_ENV_PREFIX = "AGENTD_WEBHOOK_"
FIELDS = {"name", "agent_id", "schedule", "action", "delivery", "enabled", "one_shot", "catch_up",
          "max_runs_per_day", "max_cost_usd_per_day"}
PUBLIC = ("id", "name", "agent_id", "schedule", "action", "delivery", "enabled", "one_shot", "catch_up",
          "max_runs_per_day", "max_cost_usd_per_day", "next_run_at", "last_run", "paused_reason", "origin",
          "key_id", "created_at")


def is_loopback_host(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _text(data: dict[str, Any], key: str, field: str, *, required: bool = True, limit: int = 2048) -> str:
    value = data.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise BadRequest(f"{field}: must be a non-empty string")
    if len(value.encode("utf-8")) > limit:
        raise BadRequest(f"{field}: too long (max {limit} bytes)")
    if holds_nul(value):
        raise BadRequest(f"{field}: {NUL_MESSAGE}")
    return value


def _only(data: dict[str, Any], allowed: set[str], field: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise BadRequest(f"{field}.{unknown[0]}: unknown field")


def parse_action(data: Any, workflow_exists: Callable[[str], bool]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BadRequest("action: must be an object with kind agent_turn or workflow_run")
    kind = data.get("kind")
    if kind == "agent_turn":
        _only(data, {"kind", "message", "timeout_secs"}, "action")
        message = _text(data, "message", "action.message", limit=MESSAGE_LIMIT)
        action: dict[str, Any] = {"kind": "agent_turn", "message": message}
        if "timeout_secs" in data:
            timeout = data["timeout_secs"]
            if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= 86400:
                raise BadRequest("action.timeout_secs: must be an integer between 1 and 86400")
            action["timeout_secs"] = timeout
        return action
    if kind == "workflow_run":
        _only(data, {"kind", "workflow_id", "input"}, "action")
        workflow_id = _text(data, "workflow_id", "action.workflow_id", limit=100)
        text = data.get("input", "")
        if not isinstance(text, str):
            raise BadRequest("action.input: must be a string")
        if len(text.encode("utf-8")) > MESSAGE_LIMIT:
            raise BadRequest("action.input: too long (max 64 KB)")
        if holds_nul(text):
            raise BadRequest(f"action.input: {NUL_MESSAGE}")
        if not workflow_exists(workflow_id):
            raise BadRequest(f"action.workflow_id: no workflow {workflow_id!r}")
        return {"kind": "workflow_run", "workflow_id": workflow_id, "input": text}
    raise BadRequest("action.kind: must be agent_turn or workflow_run")


def parse_delivery(data: Any, channel_agents: Callable[[str], list[Any] | None]) -> dict[str, Any]:
    if data is None:
        return {"kind": "none"}
    if not isinstance(data, dict):
        raise BadRequest("delivery: must be an object with kind none, channel or webhook")
    kind = data.get("kind")
    if kind == "none":
        _only(data, {"kind"}, "delivery")
        return {"kind": "none"}
    if kind == "channel":
        _only(data, {"kind", "channel", "chat_id"}, "delivery")
        channel = _text(data, "channel", "delivery.channel", limit=100)
        if channel_agents(channel) is None:
            raise BadRequest(f"delivery.channel: channel {channel!r} is not configured")
        return {"kind": "channel", "channel": channel,
                "chat_id": _text(data, "chat_id", "delivery.chat_id", required=False, limit=512)}
    if kind == "webhook":
        _only(data, {"kind", "url", "secret_env"}, "delivery")
        url = _text(data, "url", "delivery.url")
        # (An unusable URL -- a space, a port out of range, `https://[` -- would fail every delivery.)
        parts = urlsplit(url) if usable_http_url(url) else None
        if parts is None or (parts.scheme == "http" and not is_loopback_host(parts.hostname or "")):
            raise BadRequest("delivery.url: must be an https:// URL (http:// only to a loopback address)")
        secret_env = _text(data, "secret_env", "delivery.secret_env", limit=200)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", secret_env):
            raise BadRequest("delivery.secret_env: must be an environment variable name")
        return {"kind": "webhook", "url": url, "secret_env": secret_env}
    raise BadRequest("delivery.kind: must be none, channel or webhook")


MAX_RUNS_PER_DAY = 1_000_000  # the triggers' bound too; far below the column's 32-bit limit


def _limit(data: dict[str, Any], key: str, integer: bool) -> Any:
    value = data.get(key)
    if value is None:
        return None
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if integer and ok and value > MAX_RUNS_PER_DAY:
        raise BadRequest(f"{key}: must be at most {MAX_RUNS_PER_DAY}, or null")
    if not ok or value <= 0 or (not integer and value != value):
        raise BadRequest(f"{key}: must be {'an integer' if integer else 'a number'} greater than 0, or null")
    return value if integer else float(value)


class CronJobs:
    """The jobs; `resolve_agent(ref)` finds an agent by id or name (None: unknown),
    `workflow_exists(id)`, `channel_agents(name)`: the agents a channel answers as (None:
    not configured; a None entry: an agent gone); `changed()` wakes the ticker;
    `key_runs`: what a scoped key may reach (None: every caller is the admin)."""

    def __init__(self, store: CronStore, settings: SchedulesConfig, resolve_agent: Callable[[str], Any],
                 workflow_exists: Callable[[str], bool], channel_agents: Callable[[str], list[Any] | None],
                 changed: Callable[[], None] = lambda: None, audit: Audit | None = None,
                 key_runs: KeyRuns | None = None) -> None:
        self.store = store
        self.audit = audit
        self.key_runs = key_runs
        self.settings = settings
        self.resolve_agent = resolve_agent
        self.workflow_exists = workflow_exists
        self.channel_agents = channel_agents
        self.changed = changed

    # -- validation ----------------------------------------------------------------------
    def _agent_id(self, ref: Any, action: dict[str, Any], by: Principal) -> str:
        if ref is None and action["kind"] == "workflow_run":
            return ""
        if not isinstance(ref, str) or not ref.strip():
            raise BadRequest("agent_id: must be an agent's id or name")
        handle = self.resolve_agent(ref.strip())
        if handle is None:
            raise BadRequest(f"agent_id: no agent {ref!r}")
        if by.agents and self.key_runs is not None:
            self.key_runs.reach(by, handle, lambda: BadRequest(f"agent_id: no agent {ref!r}"))
        return handle.id

    def _reach_workflow(self, action: dict[str, Any], by: Principal) -> None:
        if action["kind"] == "workflow_run" and by.agents and self.key_runs is not None:
            workflow_id = action["workflow_id"]
            self.key_runs.reach_steps(by, workflow_id,
                                      lambda: BadRequest(f"action.workflow_id: no workflow {workflow_id!r}"))

    def _check_delivery(self, delivery: dict[str, Any] | None, by: Principal,
                        saved: dict[str, Any] | None = None) -> None:
        """400 for a webhook `secret_env` the daemon's environment does not hold, and for a
        scoped key's delivery beyond the key: a `secret_env` outside its prefix (checked first,
        so a key learns nothing of other variables), or a channel answering as an agent outside
        the key's list (in the words for an unknown channel). The job's `saved` webhook may
        stay as it is (the admin may have named it; not with another URL)."""
        delivery = delivery or {}
        name = delivery.get("secret_env") or ""
        kept = saved is not None and all(delivery.get(k) == saved.get(k) for k in ("url", "secret_env"))
        if name and not by.is_admin and not kept and not confined(name, WEBHOOK_ENV_PREFIX):
            # The name is not echoed: a secret pasted into the field may look like one.
            raise BadRequest(f"delivery.secret_env: a scoped API key may only name a variable starting with "
                             f"{WEBHOOK_ENV_PREFIX} (other variables only the admin may name)")
        if not kept and unset_secret(delivery):
            # Every delivery would fail: the daemon reads its environment only when it starts.
            # Named only to the caller who sent it (an error is neither stored nor logged).
            raise BadRequest(f"delivery.secret_env: environment variable {name} is not set "
                             "(the daemon reads its environment when it starts)")
        if delivery.get("kind") == "channel" and by.agents and self.key_runs is not None:
            channel = delivery["channel"]
            for handle in self.channel_agents(channel) or []:
                if handle is not None:
                    self.key_runs.reach(by, handle, lambda: BadRequest(
                        f"delivery.channel: channel {channel!r} is not configured"))

    def _audited(self, event: str, job: dict[str, Any], by: Principal, **detail: Any) -> None:
        if self.audit is not None:
            who = {"by": by.name, "key_id": by.key_id} if by.key_id else {"by": by.name}
            self.audit(event, job["name"], {"job_id": job["id"], "agent_id": job["agent_id"] or None, **who,
                                            **detail})

    def validate(self, data: Any, partial: bool = False) -> dict[str, Any]:
        """The stored fields of a job body (`partial`: a PATCH, only the fields given)."""
        if not isinstance(data, dict):
            raise BadRequest("request body: must be a JSON object")
        unknown = sorted(set(data) - FIELDS)
        if unknown:
            raise BadRequest(f"{unknown[0]}: unknown field")
        out: dict[str, Any] = {}
        if not partial:
            for key in ("name", "schedule", "action"):
                if key not in data:
                    raise BadRequest(f"{key}: required")
        if "name" in data:
            name = data["name"]
            if not isinstance(name, str) or not NAME.match(name):
                raise BadRequest("name: 1-128 characters: letters, digits, spaces and - _ . : @")
            out["name"] = name
        if "schedule" in data:
            out["schedule"] = parse_schedule(data["schedule"]).to_json()
        if "action" in data:
            out["action"] = parse_action(data["action"], self.workflow_exists)
        if "delivery" in data or not partial:
            out["delivery"] = parse_delivery(data.get("delivery"), self.channel_agents)
        for key in ("enabled", "one_shot"):
            if key in data:
                if not isinstance(data[key], bool):
                    raise BadRequest(f"{key}: must be true or false")
                out[key] = data[key]
        if "catch_up" in data:
            if data["catch_up"] not in CATCH_UP:
                raise BadRequest("catch_up: must be skip or once")
            out["catch_up"] = data["catch_up"]
        if "max_runs_per_day" in data:
            out["max_runs_per_day"] = _limit(data, "max_runs_per_day", True)
        if "max_cost_usd_per_day" in data:
            out["max_cost_usd_per_day"] = _limit(data, "max_cost_usd_per_day", False)
        return out

    # -- operations ----------------------------------------------------------------------
    def create(self, data: Any, origin: str = "api", by: Principal = ADMIN) -> dict[str, Any]:
        """A new job; `by`: who creates it (a scoped key's runs of it act as that key)."""
        fields = self.validate(data)
        self._check_delivery(fields["delivery"], by)
        if "agent_id" not in data and fields["action"]["kind"] == "agent_turn":
            raise BadRequest("agent_id: required")
        fields["agent_id"] = self._agent_id(data.get("agent_id"), fields["action"], by)
        self._reach_workflow(fields["action"], by)
        fields["key_id"] = by.key_id or None
        job = self.add(fields, origin)
        self._audited("cron.create", job, by, origin=origin)
        return job

    def add(self, fields: dict[str, Any], origin: str) -> dict[str, Any]:
        """Store validated fields as a new job (its first due time computed here)."""
        fields.setdefault("enabled", True)
        fields["origin"] = origin
        schedule = schedule_from_json(fields["schedule"])
        fields["next_due"] = schedule.first_due(time.time()) if fields["enabled"] else None
        if fields["enabled"] and fields["next_due"] is None:
            raise BadRequest("schedule.at: must be in the future")
        job = self.store.create(fields, self.settings.max_jobs_per_agent)
        self.changed()
        return self.view(job)

    @staticmethod
    def _key(job_id: Any) -> str | None:
        """The job id as stored (a UUID), None for anything that cannot be one."""
        try:
            return str(uuid.UUID(job_id)) if isinstance(job_id, str) else None
        except ValueError:
            return None

    def get_raw(self, job_id: str) -> dict[str, Any]:
        key = self._key(job_id)
        job = self.store.get(key) if key else None
        if job is None:
            raise NotFound("cron job not found")
        return job

    def get(self, job_id: str) -> dict[str, Any]:
        return self.view(self.get_raw(job_id))

    def list(self, agent_id: str | None = None) -> list[dict[str, Any]]:
        return [self.view(j) for j in self.store.list(agent_id)]

    def update(self, job_id: str, data: Any, by: Principal = ADMIN) -> dict[str, Any]:
        updated = self.change(job_id, data, by)
        self._audited("cron.update", updated, by, fields=sorted(data))
        return self.view(updated)

    def change(self, job_id: str, data: Any, by: Principal = ADMIN) -> dict[str, Any]:
        """`update` without its audit entry (a manifest's own job follows its agent's)."""
        job = self.get_raw(job_id)
        changes = self.validate(data, partial=True)
        if job["origin"] == "manifest" and changes.get("name", job["name"]) != job["name"]:
            # The name is how each start finds the job the manifest keeps (agentd/schedules/manifest.py).
            raise BadRequest(f"name: a manifest schedule's job keeps the name its agent's manifest gives it "
                             f"({job['name']!r})")
        self._check_delivery(changes.get("delivery"), by, job["delivery"])
        action = changes.get("action", job["action"])
        if "action" in changes:
            self._reach_workflow(action, by)
        if "agent_id" in data:
            changes["agent_id"] = self._agent_id(data["agent_id"], action, by)
        elif action["kind"] == "agent_turn" and not job["agent_id"]:
            raise BadRequest("agent_id: required for an agent_turn action")
        if by.key_id and any(changes[name] != job[name] for name in OWNED if name in changes):
            # What the job does is now the key's words: its runs are the key's, not the admin's.
            changes["key_id"] = by.key_id
        enabled = changes.get("enabled", job["enabled"])
        if "enabled" in changes or "schedule" in changes:
            if enabled:
                schedule = schedule_from_json(changes.get("schedule", job["schedule"]))
                changes["next_due"] = schedule.first_due(time.time())
                if changes["next_due"] is None:
                    raise BadRequest("schedule.at: must be in the future")
                if changes.get("enabled"):
                    changes.update(paused_reason=None, failures=0, backoff_until=None)
            else:
                changes["next_due"] = None
        updated = self.store.update(job["id"], **changes)
        if updated is None:
            raise NotFound("cron job not found")
        self.changed()
        return updated

    def delete(self, job_id: str, by: Principal = ADMIN) -> None:
        job = self.get_raw(job_id)
        if not self.store.delete(job["id"]):
            raise NotFound("cron job not found")
        self.changed()
        self._audited("cron.delete", job, by)

    def delete_agent_jobs(self, agent_id: str) -> int:
        ids = self.store.agent_jobs(agent_id)
        for job_id in ids:
            self.store.delete(job_id)
        if ids:
            self.changed()
        return len(ids)

    def runs(self, job_id: str, limit: int = RUN_RETENTION) -> list[dict[str, Any]]:
        job = self.get_raw(job_id)
        return self.store.runs(job["id"], limit)

    @staticmethod
    def view(job: dict[str, Any]) -> dict[str, Any]:
        out = {key: job[key] for key in PUBLIC}
        out["agent_id"] = job["agent_id"] or None
        return out
