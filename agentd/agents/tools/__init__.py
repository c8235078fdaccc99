"""Built-in tools. Importing this package registers every tool."""

# Import order is registration order, which is the order tools are listed and offered.
from agentd.agents.tools import files, shell, web, memory, agents, cooperation, a2a, skills, system  # noqa: F401, I001
from agentd.agents.tools import processes, channel, browser, media, containers  # noqa: F401, I001
from agentd.agents.tools import schedule  # noqa: F401, I001
from agentd.agents.tools.base import (REGISTRY, AgentOps, Tool, ToolContext, ToolError, all_tools, get_tool,
                                      validate_args)

__all__ = ["REGISTRY", "AgentOps", "Tool", "ToolContext", "ToolError", "all_tools", "get_tool", "validate_args"]
