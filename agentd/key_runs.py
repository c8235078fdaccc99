"""The scoped API key a cron job or trigger acts as when it fires.

A job or trigger created with a scoped key remembers the key (`key_id`), and every run it
starts is that key's: the run's usage rows name the key, so they count toward its spend and
its budget (checked before the run, agentd/agents/run_checks.py). The run is refused, with
the reason in the job's run history or the trigger's `trigger.refused` audit entry, when the
key was deleted, is disabled or expired, no longer holds `manage` (the scope that made the
job), or no longer reaches an agent the run needs. A job or trigger without a key is the
admin's and runs as before.
"""

from __future__ import annotations

from typing import Any, Callable

from agentd.apikeys import ApiKeys
from agentd.errors import Forbidden, NotFound
from agentd.principals import Principal, run_fields

CREATING_SCOPE = "manage"  # what POST /api/cron/jobs and /api/triggers need


class KeyRuns:
    """`find_agent(ref)`: an agent by id or name (None: unknown); `workflow_steps(id)`: a
    workflow's steps as the engine keeps them."""

    def __init__(self, keys: ApiKeys, find_agent: Callable[[str], Any],
                 workflow_steps: Callable[[str], list[dict[str, Any]]]) -> None:
        self.keys = keys
        self.find_agent = find_agent
        self.workflow_steps = workflow_steps

    def fields(self, key_id: str | None, handle: Any) -> dict[str, str]:
        """The RunRequest fields of a run of `handle` acting as `key_id` ({}: the admin's)."""
        if not key_id:
            return {}
        who = self._acting(key_id)
        self._reach(who, handle)
        return run_fields(who, handle)

    def workflow_payer(self, key_id: str | None, workflow_id: str) -> str:
        """The key a workflow run acting as `key_id` is paid by ("": the admin's), once every
        agent its steps name is within the key's list."""
        if not key_id:
            return ""
        who = self._acting(key_id)
        if who.agents:
            for step in self.workflow_steps(workflow_id):
                ref = next(iter(step["agent"].values()), None) if step.get("agent") else None
                handle = self.find_agent(ref) if isinstance(ref, str) and ref else None
                if handle is not None:
                    self._reach(who, handle)
        return who.key_id

    def _acting(self, key_id: str) -> Principal:
        who = self.keys.acting(key_id)
        who.require(CREATING_SCOPE)
        # Before a trigger counts a firing (the run's own check comes after it).
        self.keys.budgets.check_budget(key_id)
        return who

    @staticmethod
    def _reach(who: Principal, handle: Any) -> None:
        try:
            who.reach(handle)  # (audited)
        except NotFound:
            raise Forbidden(f"API key '{who.name}' may not reach agent '{handle.name}'") from None
