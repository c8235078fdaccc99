"""The cron jobs a manifest's `schedule` asks for, kept in step with the agent.

`periodic` keeps one job `<agent>:periodic` (the manifest's cron expression and zone);
`continuous` keeps one job `<agent>:continuous` every `check_interval_secs`. Each runs the
agent with the manifest's `message`, or else `DEFAULT_MESSAGE`: the agent's standing
instruction is its system prompt, and the message asks it to act on it. A spawn (and every
start of the daemon) creates or updates the job; a manifest without it removes it; killing
the agent removes all its jobs, whoever made them. `proactive` conditions are triggers,
not jobs: they are left to the trigger engine.

The job acts as the scoped API key that spawned the agent or last changed its manifest
(`handle.key_id`, kept with the agent: a job made again at a start is the key's too;
agentd/key_runs.py): its runs are that key's, and are refused once the key is disabled or
deleted.
"""

from __future__ import annotations

import logging
from typing import Any

from agentd.schedules.jobs import CronJobs

log = logging.getLogger("agentd.schedules")

DEFAULT_MESSAGE = ("Scheduled check ({what}): act on your standing instructions now. "
                   "If nothing needs doing, answer briefly that nothing needs doing.")


def wanted(name: str, schedule: dict[str, Any]) -> tuple[str, dict[str, Any], str] | None:
    """(job name, schedule object, message) for a manifest schedule that is a job."""
    kind = schedule.get("kind")
    if kind == "periodic":
        spec = {"kind": "cron", "expr": schedule["cron"], "tz": schedule.get("tz") or "UTC"}
        what = f"cron {schedule['cron']}"
    elif kind == "continuous":
        spec = {"kind": "every", "every_secs": schedule["check_interval_secs"]}
        what = f"every {schedule['check_interval_secs']} s"
    else:
        return None
    return f"{name}:{kind}", spec, schedule.get("message") or DEFAULT_MESSAGE.format(what=what)


class ManifestSchedules:
    """The registry's lifecycle hooks for manifest schedules."""

    def __init__(self, jobs: CronJobs) -> None:
        self.jobs = jobs

    def check(self, manifest: Any) -> None:
        pass  # the manifest's parser has validated its schedule

    def spawned(self, handle: Any) -> None:
        self.sync(handle)

    def loaded(self, handle: Any) -> None:
        if wanted(handle.name, handle.manifest.schedule) is None:
            return  # a manifest never changes in place: a reactive agent has no manifest job to drop
        try:
            self.sync(handle)
        except Exception:  # noqa: BLE001 - one agent's schedule must not keep the daemon from starting
            log.exception("agent %s: manifest schedule not applied", handle.name)

    def killed(self, handle: Any) -> None:
        removed = self.jobs.delete_agent_jobs(handle.id)
        if removed:
            log.info("agent %s: %d cron job(s) removed with it", handle.name, removed)

    def sync(self, handle: Any) -> None:
        want = wanted(handle.name, handle.manifest.schedule)
        mine = [j for j in self.jobs.store.list(handle.id) if j["origin"] == "manifest"]
        keep = None
        for job in mine:
            if want is not None and keep is None and job["name"] == want[0]:
                keep = job
            else:
                self.jobs.store.delete(job["id"])
        if want is None:
            return
        name, spec, message = want
        action = {"kind": "agent_turn", "message": message}
        if keep is None:
            self.jobs.add({"name": name, "agent_id": handle.id, "schedule": spec, "action": action,
                           "delivery": {"kind": "none"}, "key_id": handle.key_id or None}, origin="manifest")
            return
        if keep["schedule"] != spec or keep["action"] != action:
            self.jobs.change(keep["id"], {"schedule": spec, "action": action})
        if keep["key_id"] != (handle.key_id or None):
            self.jobs.store.update(keep["id"], key_id=handle.key_id or None)
