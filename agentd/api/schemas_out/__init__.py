"""marshmallow schemas of response bodies, for the OpenAPI document.

They describe what the routes answer (required = always present); extra fields
are allowed (`unknown = INCLUDE`) so a field added later does not make old
clients' validators fail. The fuzz test (tests/api/test_fuzz_api.py) checks every
response against them.
"""

from agentd.api.schemas_out.agents import *  # noqa: F401,F403
from agentd.api.schemas_out.base import *  # noqa: F401,F403
from agentd.api.schemas_out.catalog import *  # noqa: F401,F403
from agentd.api.schemas_out.channels import *  # noqa: F401,F403
from agentd.api.schemas_out.memory import *  # noqa: F401,F403
from agentd.api.schemas_out.mcp import *  # noqa: F401,F403
from agentd.api.schemas_out.openai import *  # noqa: F401,F403
from agentd.api.schemas_out.triggers import *  # noqa: F401,F403
from agentd.api.schemas_out.keys import *  # noqa: F401,F403
from agentd.api.schemas_out.a2a import *  # noqa: F401,F403
