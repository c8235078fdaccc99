"""The daemon's services as publishers: each function turns one service's callback into
events on the bus."""

from __future__ import annotations

from typing import Any, Callable

from agentd.triggers.bus import CHANNEL, MEMORY, WORKFLOW, Event, EventBus

OUTPUT_MAX = 4000  # of a workflow's output, in its event


def kv_changes(bus: EventBus) -> Callable[[str, str, Any, bool, str], None]:
    """KvMemory's on_change."""
    def changed(agent_id: str, key: str, value: Any, deleted: bool, origin: str) -> None:
        bus.publish(Event(MEMORY, "memory_key_changed",
                          {"agent_id": agent_id, "key": key, "value": value,
                           "operation": "delete" if deleted else "set"},
                          agent_id=agent_id, origin=origin))
    return changed


def workflow_runs(bus: EventBus) -> Callable[[dict[str, Any], dict[str, Any], str], None]:
    """WorkflowEngine's on_finish: a completed run is a `workflow_completed` event, of the
    scoped key that started the run (its output is the key's doing)."""
    def finished(workflow: dict[str, Any], result: dict[str, Any], key_id: str) -> None:
        if result.get("status") != "completed":
            return
        output = result.get("output") or ""
        bus.publish(Event(WORKFLOW, "workflow_completed",
                          {"workflow_id": workflow.get("id"), "workflow_name": workflow.get("name"),
                           "run_id": result["run_id"], "status": "completed", "output": output[:OUTPUT_MAX]},
                          key_id=key_id))
    return finished


def channel_messages(bus: EventBus) -> Callable[[str, Any], None]:
    """ChannelManager's on_inbound: every message the allow-lists let through."""
    def inbound(channel: str, msg: Any) -> None:
        conversation = msg.conversation
        bus.publish(Event(CHANNEL, "channel_message",
                          {"channel": channel, "chat_id": conversation.chat_id, "sender_id": msg.sender_id,
                           "sender_name": msg.sender_name, "message_id": msg.message_id, "text": msg.text}))
    return inbound
