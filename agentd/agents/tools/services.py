"""The daemon's long-lived backends of the built-in tools, owned by the kernel.

Tools reach them through `ToolContext.services`. Everything an agent holds here (programs,
a browser) is released when the agent is killed (`release`) and when the daemon stops
(`close`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from agentd.agents.tools.browser_sessions import BrowserSessions
from agentd.agents.tools.processes import ProcessTable
from agentd.config import ToolsConfig


@dataclass
class ModelAccess:
    """The calling agent's model, for tools that ask it (image analysis) or its provider's
    other OpenAI-compatible endpoints (audio, images)."""

    provider: str
    model: str
    supports_vision: bool | None  # None: the catalog does not know the model
    endpoints: tuple[str, ...]  # the provider's media endpoints (catalog `endpoints`)
    call: Callable[[Any, Any], Any]  # (ChatRequest, cancel) -> ChatResponse, usage recorded
    endpoint: Callable[[], Any]  # -> ProviderEndpoint (base URL, key read now)


class ToolServices:
    """Processes, browsers, uploads, channel sending and the audit trail, for tools."""

    def __init__(self, config: ToolsConfig, audit: Callable[[str, str, dict[str, Any]], None],
                 save_upload: Callable[[str, str, str, bytes], dict[str, Any]],
                 channel_send: Callable[..., dict[str, Any]]) -> None:
        self.config = config
        self.audit = audit
        # (agent_id, filename, content_type, data) -> the upload's description
        self.save_upload = save_upload
        # (channel, recipient, message, **options) -> {"message_id", ...}; see ChannelManager.send_to
        self.channel_send = channel_send
        self.processes = ProcessTable(config)
        self.browsers = BrowserSessions(config)

    def listing(self) -> list[dict[str, Any]]:
        """GET /api/tools: every tool, and why it cannot work here when it cannot."""
        from agentd.agents.tools.base import all_tools

        rows = []
        for t in all_tools():
            reason = t.unavailable(self.config)
            rows.append({"name": t.name, "family": t.family, "description": t.description,
                         "parameters": t.parameters, "read_only": t.read_only, "capability": t.capability,
                         "available": reason is None, "reason": reason})
        return rows

    # The registry's agent hooks: nothing to check or start at spawn; a kill ends the agent's
    # programs and its browser.
    def check(self, manifest: Any) -> None:
        pass

    def spawned(self, handle: Any) -> None:
        pass

    def loaded(self, handle: Any) -> None:
        pass

    def killed(self, handle: Any) -> None:
        self.processes.release(handle.id)
        self.browsers.close(handle.id)

    def close(self) -> None:
        self.processes.close()
        self.browsers.close_all()
