"""An A2A agent served by the A2A project's Python SDK (`a2a-sdk` 1.x) with its defaults: JSON-RPC
that speaks only 1.0. It answers each message with a message `sdk-echo: <text>`.
argv: PORT."""

from __future__ import annotations

import sys

import uvicorn
from a2a.helpers.proto_helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette


class Echo(AgentExecutor):
    async def execute(self, context, event_queue) -> None:
        await event_queue.enqueue_event(new_text_message(f"sdk-echo: {context.get_user_input()}",
                                                         context_id=context.context_id, task_id=context.task_id))

    async def cancel(self, context, event_queue) -> None:
        pass


def main() -> None:
    port = int(sys.argv[1])
    card = AgentCard(
        name="sdkagent", description="An a2a-sdk agent", version="1.0.0",
        supported_interfaces=[AgentInterface(url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC",
                                             protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True), default_input_modes=["text/plain"],
        default_output_modes=["text/plain"], skills=[AgentSkill(id="echo", name="echo", description="Echoes",
                                                                tags=["echo"])])
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card)
    app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/"))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
