"""`[[mcp_servers]]` in config.toml: one table per MCP server agents may use.

A server is started as a command speaking stdio (`command`, `args`) or reached over
Streamable HTTP (`url`). Secrets never sit in the file: `env` names the daemon's
environment variables the command receives, `headers_env` maps an HTTP header to the
variable holding its value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentd.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
DEFAULT_TIMEOUT_SECS = 60.0
KEYS = {"name", "command", "args", "env", "url", "headers_env", "timeout_secs", "cwd"}


@dataclass(frozen=True)
class McpServerSpec:
    """One configured MCP server (equal specs need no reconnect on a config reload)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    url: str = ""
    headers_env: tuple[tuple[str, str], ...] = ()
    timeout_secs: float = DEFAULT_TIMEOUT_SECS
    cwd: str = ""

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "streamable_http"


def _fail(index: int, key: str, message: str) -> ConfigError:
    return ConfigError(f"config key mcp_servers[{index}].{key}: {message}")


def _spec(index: int, table: Any) -> McpServerSpec:
    if not isinstance(table, dict):
        raise ConfigError(f"config key mcp_servers[{index}]: expected a table")
    unknown = sorted(set(table) - KEYS)
    if "headers" in unknown:
        raise _fail(index, "headers", "literal header values are not allowed (they hold secrets): "
                                      "name the environment variable instead, headers_env = "
                                      "{Authorization = \"MY_TOKEN_ENV\"}")
    if unknown:
        raise _fail(index, unknown[0], f"unknown key (known: {', '.join(sorted(KEYS))})")
    env = table.get("env", [])
    if isinstance(env, dict):
        raise _fail(index, "env", "values are not allowed here (they hold secrets): list the names of "
                                  "the daemon's environment variables to pass, env = [\"GITHUB_TOKEN\"]")
    name = table.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise _fail(index, "name", "expected a name of letters, digits, '-' and '_' (at most 48)")
    command, url = table.get("command", ""), table.get("url", "")
    if not isinstance(command, str) or not isinstance(url, str):
        raise _fail(index, "command" if not isinstance(command, str) else "url", "expected a string")
    if bool(command.strip()) == bool(url.strip()):
        raise _fail(index, "command", "give either command (stdio) or url (Streamable HTTP), not both"
                    if command.strip() else "give command (stdio) or url (Streamable HTTP)")
    if url and not re.match(r"^https?://", url):
        raise _fail(index, "url", "expected an http:// or https:// URL")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _fail(index, "args", "expected an array of strings")
    if not isinstance(env, list) or not all(isinstance(e, str) and ENV_NAME_RE.match(e) for e in env):
        raise _fail(index, "env", "expected an array of environment variable names")
    headers = table.get("headers_env", {})
    if not isinstance(headers, dict):
        raise _fail(index, "headers_env", "expected a table of header = \"ENV_VAR_NAME\"")
    for header, var in headers.items():
        if not HEADER_RE.match(header):
            raise _fail(index, "headers_env", f"{header!r} is not an HTTP header name")
        if not isinstance(var, str) or not ENV_NAME_RE.match(var):
            raise _fail(index, f"headers_env.{header}", "expected the name of an environment variable "
                                                        "(the value itself is not allowed here)")
    if command and headers:
        raise _fail(index, "headers_env", "only for a url server")
    if url and env:
        raise _fail(index, "env", "only for a command server")
    timeout = table.get("timeout_secs", DEFAULT_TIMEOUT_SECS)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise _fail(index, "timeout_secs", "expected a number of seconds between 0 and 3600")
    cwd = table.get("cwd", "")
    if not isinstance(cwd, str):
        raise _fail(index, "cwd", "expected a string")
    return McpServerSpec(name=name, command=command.strip(), args=tuple(args), env=tuple(env),
                         url=url.strip(), headers_env=tuple(sorted(headers.items())),
                         timeout_secs=float(timeout), cwd=cwd)


def parse_mcp_servers(raw: dict[str, Any]) -> list[McpServerSpec]:
    """The `[[mcp_servers]]` tables of a parsed config.toml; ConfigError names the key at fault."""
    tables = raw.get("mcp_servers", [])
    if not isinstance(tables, list):
        raise ConfigError("config key mcp_servers: expected an array of tables ([[mcp_servers]])")
    specs = [_spec(i, t) for i, t in enumerate(tables)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise _fail(i, "name", f"{spec.name!r} is configured twice")
        seen.add(spec.name)
    return specs
