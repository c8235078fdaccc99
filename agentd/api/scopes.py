"""The scope every route needs, by endpoint name: one table for the API, `/v1`, the
sockets and the dashboard. `None`: public (no key at all). A route missing here needs
`admin` (safe by default), and tests/api/test_scopes.py fails until it is added.

read: look (GET); message: talk to agents (message, stream, WebSocket, `/v1`); manage:
change agents, workflows, channels, memory, approvals; admin: keys, provider keys,
budget, shutdown, the audit trail.
"""

from __future__ import annotations

PUBLIC = None

ENDPOINT_SCOPES: dict[str, str | None] = {
    # system
    "system.health": PUBLIC, "system.version": PUBLIC, "docs.openapi_json": PUBLIC, "static": PUBLIC,
    "system.status": "read", "system.health_detail": "read", "system.sse_ticks": "read",
    "system.shutdown": "admin",
    "sockets.echo": "read",
    # agents
    "agents.list_agents": "read", "agents.detail": "read", "agents.session": "read", "agents.profiles": "read",
    "agents.approvals": "read",
    "agents.message": "message", "stream.message_stream": "message", "sockets.agent_socket": "message",
    "agents.upload": "message", "agents.stop": "message",
    "agents.spawn": "manage", "agents.kill": "manage", "agents.set_mode": "manage",
    "agents.update_manifest": "manage", "agents.set_model": "manage", "agents.compact": "manage",
    "agents.reset": "manage", "agents.delete_session": "manage", "agents.approve": "manage",
    "agents.reject": "manage",
    # memory
    "memory.all_keys": "read", "memory.get_key": "read", "memory.list_memories": "read",
    "memory.get_memory": "read", "memory.export": "read", "memory.recall": "read", "memory.query_graph": "read",
    "memory.put_key": "manage", "memory.delete_key": "manage", "memory.remember": "manage",
    "memory.delete_memory": "manage", "memory.update_memory": "manage", "memory.add_entity": "manage",
    "memory.add_relation": "manage",
    "memory.import_memory": "manage", "memory.consolidate": "manage",
    # catalog, usage, budget, providers
    "catalog.models": "read", "catalog.model": "read", "catalog.aliases": "read", "catalog.providers": "read",
    "catalog.usage": "read", "catalog.usage_by_model": "read", "catalog.budget": "read",
    "catalog.budget_agents": "read",
    "catalog.add_custom": "manage", "catalog.remove_custom": "manage", "catalog.test_provider": "manage",
    "catalog.set_key": "admin", "catalog.delete_key": "admin", "catalog.set_url": "admin",
    "catalog.set_budget": "admin",
    # workflows
    "workflows.list_workflows": "read", "workflows.detail": "read", "workflows.runs": "read",
    "workflows.run_detail": "read", "workflows.run_events": "read",
    "workflows.create": "manage", "workflows.update": "manage", "workflows.delete": "manage",
    "workflows.run": "manage", "workflows.start_run": "manage", "workflows.cancel_run": "manage",
    # channels, cluster, audit
    "channels.list_channels": "read", "channels.qr_status": "read", "cluster.cluster": "read",
    "cluster.cluster_runs": "read",
    "channels.configure": "manage", "channels.remove": "manage", "channels.qr_start": "manage",
    "channels.test": "manage", "channels.reload_channels": "manage",
    "channels.audit_recent": "admin",
    # chat platforms' webhooks: signed by the platform, checked by the adapter
    "webhooks.webhook": PUBLIC,
    # OpenAI-compatible
    "openai.chat_completions": "message", "openai.models": "message", "openai.model": "message",
    # scoped keys
    "keys.list_keys": "admin", "keys.create_key": "admin", "keys.get_key": "admin", "keys.update_key": "admin",
    "keys.delete_key": "admin", "keys.rotate_key": "admin",
    # the dashboard (login, logout and the icon are open: they authenticate nothing)
    "pages.login": PUBLIC, "pages.login_submit": PUBLIC, "pages.logout": PUBLIC, "pages.favicon": PUBLIC,
    "pages.index": "read", "pages.agents_list": "read", "pages.agent_page": "read", "pages.agent_memory": "read",
    "pages.api_page": "read", "pages.approvals": "read", "pages.channels": "read", "pages.models": "read",
    "pages.providers": "read", "pages.usage": "read", "pages.workflows": "read", "pages.workflow_page": "read",
    "pages.agent_message": "message", "pages.agent_stop": "message",
    "pages.agents_spawn": "manage", "pages.agent_compact": "manage", "pages.agent_kill": "manage",
    "pages.agent_mode": "manage", "pages.agent_reset": "manage",
    "pages.approval_decide": "manage",
    "pages.workflow_run": "manage", "pages.provider_test": "manage",
    "pages.memory_fragment": "read", "pages.memory_export": "read", "pages.memory_graph": "read",
    "pages.memory_entity": "read",
    "pages.memory_add": "manage", "pages.memory_edit": "manage", "pages.memory_delete": "manage",
    "pages.memory_kv_set": "manage", "pages.memory_kv_delete": "manage", "pages.memory_import": "manage",
    "pages.memory_consolidate": "manage", "pages.memory_entity_add": "manage",
    "pages.memory_relation_add": "manage",
    "pages.workflow_run_page": "read", "pages.workflow_new": "manage", "pages.workflow_create": "manage",
    "pages.workflow_edit": "manage", "pages.workflow_update": "manage", "pages.workflow_cancel": "manage",
    "pages.provider_key": "admin", "pages.provider_url": "admin", "pages.budget_set": "admin",
    "pages.keys": "admin", "pages.keys_create": "admin", "pages.key_action": "admin", "pages.key_edit": "admin",
    "pages.agent_files": "read", "pages.agent_file": "read", "pages.mcp_servers": "read", "pages.skills": "read",
    "pages.skill_install": "admin", "pages.skill_delete": "admin", "pages.skills_reload": "manage",
    "pages.mcp_reload": "admin",
    "pages.schedules": "read", "pages.schedule_page": "read", "pages.triggers": "read", "pages.tasks": "read",
    "pages.schedule_enable": "manage", "pages.schedule_disable": "manage", "pages.schedule_run": "manage",
    "pages.schedule_delete": "manage", "pages.trigger_action": "manage", "pages.task_post": "manage",
    "pages.schedule_create": "manage", "pages.trigger_create": "manage",
    "pages.schedule_edit": "manage", "pages.trigger_edit": "manage",
    "pages.task_delete": "manage",
    "pages.channel_page": "read", "pages.channel_configure": "manage", "pages.channel_remove": "manage",
    "pages.channel_test": "manage",
    "pages.agent_edit": "manage", "pages.agent_manifest": "manage", "pages.agent_model": "manage",
    "pages.setup": "admin", "pages.setup_provider": "admin", "pages.setup_default": "admin",
    "pages.settings": "admin", "pages.settings_reload": "admin", "pages.audit": "admin",
    "pages.logs": "admin", "pages.logs_stream": "admin",
    # OpenAI-compatible: Responses and embeddings
    "responses.create_response": "message", "responses.retrieve_response": "message",
    "responses.delete_response": "message",
    "embeddings.create_embeddings": "message",
    # MCP and A2A: the cards are public (remote agents discover before they authenticate)
    "mcp.mcp_endpoint": "message", "mcp.list_servers": "read", "mcp.reload_servers": "admin",
    "a2a.daemon_card": PUBLIC, "a2a.agent_card": PUBLIC, "a2a.agent_cards": "read",
    "a2a.daemon_card_legacy": PUBLIC, "a2a.agent_card_legacy": PUBLIC,
    "a2a.rpc": "message", "a2a.agent_rpc": "message",
    # skills, tools, uploads, metrics
    "skills.list_skills": "read", "skills.install": "admin", "skills.delete": "admin", "skills.reload": "manage",
    "tools.tools": "read", "uploads.uploads": "read", "uploads.upload_content": "read", "metrics.metrics": "read",
    # cron jobs, triggers, events, the task board
    "cron.list_jobs": "read", "cron.detail": "read", "cron.runs": "read",
    "cron.create": "manage", "cron.update": "manage", "cron.delete": "manage", "cron.run": "manage",
    "triggers.list_triggers": "read", "triggers.detail": "read",
    "triggers.create": "manage", "triggers.update": "manage", "triggers.delete": "manage",
    "triggers.publish_event": "message",
    "tasks.list_tasks": "read", "tasks.detail": "read",
    "tasks.create": "manage", "tasks.claim": "manage", "tasks.complete": "manage", "tasks.delete": "manage",
}


def scope_of(endpoint: str | None) -> str | None:
    """The scope a route needs (`admin` for one the table does not know)."""
    if endpoint is None:
        return "read"  # no route matched: the 404 handler answers, and says nothing
    return ENDPOINT_SCOPES.get(endpoint, "admin")
