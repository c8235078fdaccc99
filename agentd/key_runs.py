"""The scoped API key a cron job or trigger acts as when it fires.

A job or trigger created with a scoped key remembers the key (`key_id`), and every run it
starts is that key's: the run's usage rows name the key, so they count toward its spend and
its budget (checked before the run, agentd/agents/run_checks.py). The run is refused, with
the reason in the job's run history or the trigger's `trigger.refused` audit entry, when the
key was deleted, is disabled or expired, no longer holds `manage` (the scope that made the
job), or no longer reaches an agent the run needs. A job or trigger without a key is the
admin's and runs as before.

The same holds for what a key's run starts from inside: a job its `cron_create` or
`schedule_create` tool makes, or an agent's manifest schedule when the key spawned it,
remembers the key; a message its `agent_send` tool sends is a run of the key, refused
when the key no longer reaches the agent.

A chat channel a scoped key configured acts as the key too (agentd/channels/inbound.py):
each inbound message's run is the key's, refused with a reply to the sender.
"""

from __future__ import annotations

from typing import Any, Callable

from agentd.apikeys import ApiKeys
from agentd.errors import AgentdError, Forbidden, NotFound
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

    def fields(self, key_id: str | None, handle: Any, scope: str | None = CREATING_SCOPE,
               hidden: Callable[[], AgentdError] | None = None) -> dict[str, str]:
        """The RunRequest fields of a run of `handle` acting as `key_id` ({}: the admin's);
        `scope`: what the key must hold (None: nothing beyond what started the asking run);
        `hidden()`: the refusal of an agent outside the key's list (see `reach`)."""
        if not key_id:
            return {}
        who = self.acting(key_id, scope)
        # Before a trigger counts a firing (the run's own check comes after it).
        self.keys.budgets.check_budget(key_id)
        self.reach(who, handle, hidden)
        return run_fields(who, handle)

    def workflow_payer(self, key_id: str | None, workflow_id: str) -> str:
        """The key a workflow run acting as `key_id` is paid by ("": the admin's), once every
        agent its steps name is within the key's list."""
        if not key_id:
            return ""
        who = self.acting(key_id)
        self.keys.budgets.check_budget(key_id)
        self.reach_steps(who, workflow_id)
        return who.key_id

    def acting(self, key_id: str, scope: str | None = CREATING_SCOPE) -> Principal:
        """The key as it is now; Forbidden when it is gone, disabled, expired or without `scope`."""
        who = self.keys.acting(key_id)
        if scope is not None:
            who.require(scope)
        return who

    def reach_steps(self, who: Principal, workflow_id: str,
                    hidden: Callable[[], AgentdError] | None = None) -> None:
        """`reach` for every agent a workflow's steps name."""
        if not who.agents:
            return
        for handle in self.step_agents(workflow_id):
            self.reach(who, handle, hidden)

    def step_agents(self, workflow_id: str) -> list[Any]:
        """The agents a workflow's steps name (those that exist)."""
        found = []
        for step in self.workflow_steps(workflow_id):
            ref = next(iter(step["agent"].values()), None) if step.get("agent") else None
            handle = self.find_agent(ref) if isinstance(ref, str) and ref else None
            if handle is not None:
                found.append(handle)
        return found

    @staticmethod
    def reach(who: Principal, handle: Any, hidden: Callable[[], AgentdError] | None = None) -> None:
        """Forbidden naming the agent when it is outside the key's list (audited), or
        `hidden()` where the caller answers as for an agent that does not exist."""
        try:
            who.reach(handle)  # (audited)
        except NotFound:
            if hidden is not None:
                raise hidden() from None
            raise Forbidden(f"API key '{who.name}' may not reach agent '{handle.name}'") from None
