"""A command that is not an MCP server: it answers every line with garbage."""

import sys

for line in sys.stdin:
    sys.stdout.write("HTTP/1.1 418 I'm a teapot, not JSON-RPC\n")
    sys.stdout.flush()
