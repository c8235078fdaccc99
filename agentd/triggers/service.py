"""Triggers: run an agent when an event matches one of its patterns.

The service listens on the event bus. For each event it reads the enabled triggers of the
event's kind, keeps those whose pattern matches, skips a trigger of the agent whose own
trigger-started run caused the event (no loops), admits each firing against the trigger's
rate limit and daily caps (agentd/triggers/store.py) and starts the run through the one run
path with origin `trigger` (as the scoped API key that created the trigger, if one did:
agentd/key_runs.py); a firing whose run is refused is taken back. A run's cost is added to
its trigger's day when it ends.

An event a scoped key published (`Event.key_id`) fires only the triggers of agents the key
may reach, whoever owns the trigger: a key cannot make an agent outside its list run with
the key's text in its prompt. The run stays the trigger owner's, as the owner set it up.
The other way round, a trigger of a key limited to some agents hears no event of an agent
outside the key's list (`_heard`).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

from agentd.agents.handle import parse_uuid
from agentd.schema_fields import is_blank
from agentd.errors import AgentdError, BadRequest, NotFound
from agentd.jsonsafe import NUL_MESSAGE, holds_nul
from agentd.triggers import patterns
from agentd.triggers.bus import CHANNEL, WORKFLOW, Event, EventBus
from agentd.triggers.manifest import check_cap, proactive_conditions
from agentd.triggers.store import Trigger, TriggerStore

if TYPE_CHECKING:
    from agentd.agents.handle import AgentHandle
    from agentd.agents.manifest import Manifest
    from agentd.agents.registry import AgentRegistry
    from agentd.agents.runs import Runs
    from agentd.key_runs import KeyRuns
    from agentd.principals import Principal

log = logging.getLogger("agentd.triggers")

Audit = Callable[[str, str, dict[str, Any]], None]
MAX_TEMPLATE = 16_384
ORIGIN = "trigger"


class TriggerLifecycle:
    """The agent registry's hooks: a manifest's proactive conditions become the agent's
    triggers at spawn (replacing earlier ones), acting as the scoped key that spawned the
    agent or changed its manifest (`handle.key_id`); a kill removes every trigger of the agent."""

    def __init__(self, store: TriggerStore) -> None:
        self.store = store

    def check(self, manifest: Manifest) -> None:
        proactive_conditions(manifest.toml_text)

    def spawned(self, handle: AgentHandle) -> None:
        self.store.delete_for_agent(handle.id, source="manifest")
        for condition in proactive_conditions(handle.manifest.toml_text):
            self.store.create(handle.id, source="manifest", key_id=handle.key_id, **condition)

    def loaded(self, handle: AgentHandle) -> None:
        pass  # the triggers are rows of the database already

    def killed(self, handle: AgentHandle) -> None:
        self.store.delete_for_agent(handle.id)


class Triggers:
    def __init__(self, store: TriggerStore, bus: EventBus, registry: AgentRegistry, runs: Runs,
                 rate_limit_per_minute: int, audit: Audit | None = None, key_runs: KeyRuns | None = None,
                 channel_agents: Callable[[str], list[Any] | None] = lambda name: None) -> None:
        self.store = store
        # The scoped key a trigger created with one acts as (None: every trigger is the admin's).
        self.key_runs = key_runs
        # The agents a channel answers as (agentd/kernel.py): what a key's trigger may hear of it.
        self.channel_agents = channel_agents
        self.registry = registry
        self.runs = runs
        self.rate_limit_per_minute = rate_limit_per_minute  # when a trigger sets none
        self.audit = audit
        bus.subscribe(self.on_event)

    # -- the API's operations --------------------------------------------------------
    def create(self, data: dict[str, Any], key_id: str = "") -> dict[str, Any]:
        """A new trigger; `key_id`: the scoped API key creating it, which its runs act as."""
        agent_id = data["agent_id"]
        handle = self.registry.find(agent_id)
        if handle is None:
            raise NotFound("agent not found")
        kind, pattern = patterns.validate(data["pattern"])
        template = _template(data["prompt_template"])
        caps = {name: check_cap(name, data.get(name), "trigger")
                for name in ("max_runs_per_day", "max_cost_usd_per_day", "rate_limit_per_minute")}
        trigger = self.store.create(handle.id, kind, pattern, template, enabled=data.get("enabled", True),
                                    key_id=key_id or None, **caps)
        if self.audit is not None:
            self.audit("trigger.create", handle.name, {"trigger_id": trigger["id"], "agent_id": handle.id})
        return trigger

    def list(self, agent_ref: str | None = None) -> list[dict[str, Any]]:
        """Every trigger, or those of one agent (by id or name; a killed agent's are gone)."""
        if agent_ref is None:
            return self.store.list()
        handle = self.registry.find(agent_ref)
        return self.store.list(handle.id) if handle is not None else []

    def get(self, trigger_id: str) -> dict[str, Any]:
        trigger = self.store.get(parse_uuid(trigger_id, "trigger"))
        if trigger is None:
            raise NotFound("trigger not found")
        return trigger

    def update(self, trigger_id: str, changes: dict[str, Any], key_id: str = "") -> dict[str, Any]:
        """`key_id`: the scoped API key changing it; a key that changes its template (its
        words in the prompt) makes the trigger the key's: its runs act as the key from then on."""
        for name in ("max_runs_per_day", "max_cost_usd_per_day", "rate_limit_per_minute"):
            if name in changes:
                changes[name] = check_cap(name, changes[name], "trigger")
        if changes.get("prompt_template") is not None:
            _template(changes["prompt_template"])
            if key_id and changes["prompt_template"] != self.get(trigger_id)["prompt_template"]:
                changes["key_id"] = key_id
        trigger = self.store.update(parse_uuid(trigger_id, "trigger"), changes)
        if trigger is None:
            raise NotFound("trigger not found")
        return trigger

    def delete(self, trigger_id: str) -> None:
        key = parse_uuid(trigger_id, "trigger")
        if not self.store.delete(key):
            raise NotFound("trigger not found")
        if self.audit is not None:
            self.audit("trigger.delete", key, {"trigger_id": key})

    # -- firing -------------------------------------------------------------------------
    def on_event(self, event: Event) -> None:
        publisher = None  # the scoped key that published the event (None: the admin or the daemon)
        if event.key_id and self.key_runs is not None:
            publisher = self.key_runs.keys.principal(event.key_id)
            if publisher is None:
                log.info("event %s not evaluated: the API key that published it is deleted, disabled or expired",
                         event.id)
                return
        for kind, target in patterns.KINDS.items():
            if target != event.kind:
                continue
            for trigger in self.store.candidates(kind):
                if not patterns.matches(trigger.pattern, trigger.agent_id, event):
                    continue
                if event.origin == ORIGIN and event.agent_id == trigger.agent_id:
                    log.info("trigger %s not fired: event %s came from its own agent's trigger run",
                             trigger.id, event.id)
                    continue
                self._fire(trigger, event, publisher)

    def _fire(self, trigger: Trigger, event: Event, publisher: Principal | None = None) -> None:
        handle = self.registry.find(trigger.agent_id)
        if handle is None:
            return
        if publisher is not None and not publisher.may_reach(handle):
            # Else a key could run, with its text in the prompt, an agent it may not reach.
            log.info("trigger %s not fired: event %s came from API key '%s', which does not reach agent %s",
                     trigger.id, event.id, publisher.name, handle.name)
            return
        try:
            acting = self.key_runs.fields(trigger.key_id, handle) if self.key_runs else {}
        except AgentdError as exc:
            self._refused(trigger, handle, event, exc)
            return
        if trigger.key_id and not self._heard(trigger.key_id, event):
            log.info("trigger %s not fired: event %s is of an agent outside its API key's list", trigger.id, event.id)
            return
        admission = self.store.admit(trigger.id, self.rate_limit_per_minute)
        if not admission.admitted:
            log.info("trigger %s not fired for event %s: %s", trigger.id, event.id, admission.why)
            return
        from agentd.agents.run_request import WORKER, RunRequest

        prompt = patterns.render(trigger.prompt_template, event)
        try:
            ticket = self.runs.start(RunRequest(handle, prompt, on=WORKER, origin=ORIGIN, from_client=False,
                                                **acting))
        except AgentdError as exc:
            self.store.refund(trigger.id, admission)
            self._refused(trigger, handle, event, exc)
            return
        if self.audit is not None:
            self.audit("trigger.fire", handle.name, {"trigger_id": trigger.id, "agent_id": handle.id,
                                                     "event_id": event.id, "event_type": event.type})
        self.store.started(trigger.id, handle.id, admission)
        if ticket.future is not None:
            ticket.future.add_done_callback(lambda f: self._finished(trigger, f))

    def _heard(self, key_id: str, event: Event) -> bool:
        """Whether a trigger of `key_id` may hear `event`: not when it is of an agent outside
        the key's list (its failure or its published event), of a channel answering as one,
        or of a workflow with a step on one; else a key would read what it may not reach."""
        if self.key_runs is None:
            return True
        who = self.key_runs.keys.principal(key_id)
        if who is None:
            return False
        if not who.agents:
            return True
        agents = [self.registry.find(event.agent_id)] if event.agent_id else []
        try:
            if event.kind == CHANNEL:
                agents += self.channel_agents(event.payload.get("channel") or "") or []
            elif event.kind == WORKFLOW:
                agents += self.key_runs.step_agents(event.payload.get("workflow_id") or "")
        except AgentdError:
            return False  # its workflow deleted meanwhile: nothing left to tell what it reached
        return all(h is None or who.may_reach(h) for h in agents)

    def _refused(self, trigger: Trigger, handle: AgentHandle, event: Event, exc: AgentdError) -> None:
        log.warning("trigger %s: agent %s refused the run: %s", trigger.id, handle.name, exc.message)
        if self.audit is not None:
            self.audit("trigger.refused", handle.name, {"trigger_id": trigger.id, "event_id": event.id,
                                                        "error": exc.message[:200]})

    def _finished(self, trigger: Trigger, future: Future) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        cost = getattr(future.result(), "cost_usd", None)
        if cost:
            self.store.add_cost(trigger.id, cost)


def _template(template: str) -> str:
    if is_blank(template) or len(template) > MAX_TEMPLATE:
        raise BadRequest(f"prompt_template: must be a non-empty string of at most {MAX_TEMPLATE} characters")
    if holds_nul(template):
        raise BadRequest(f"prompt_template: {NUL_MESSAGE}")
    return template
