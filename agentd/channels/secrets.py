"""Channel secrets through the API and the dashboard: the variables a configure body may name
in `*_env` keys, and secrets given as values (the `secrets` object, the dashboard's password
fields), written to `secrets.env` and the daemon's environment by the same writer as
provider keys (agentd/providers.py), never to config.toml.

A secret belongs to one of the adapter's `*_env` keys; the section records the variable's
NAME under that key. The variable is the key's catalogue default (`TELEGRAM_BOT_TOKEN`; for a
key without one, `<ADAPTER>_<KEY>` such as `MATRIX_REFRESH_TOKEN`) or a name of the adapter's
own (`TELEGRAM_...`): a configure body can never overwrite `PATH`, a provider key or anything
else of the daemon's environment. Nor can a scoped API key name one in a `*_env` key and have
the adapter send it to a URL of the key's choosing (agentd/env_names.py). The admin names any
variable (as in a config.toml edited by hand): it could send a provider's key anywhere by its
base URL anyway.
"""

from __future__ import annotations

from typing import Any

from agentd.channels.catalog import ChannelInfo
from agentd.env_names import confined
from agentd.errors import BadRequest

MAX_SECRET = 8192


def env_keys(info: ChannelInfo) -> dict[str, str]:
    """The adapter's `*_env` keys and each one's default variable name ("" when none)."""
    defaults = {f["key"]: f["env_var"] or "" for f in info.data["fields"] if f["type"] == "secret"}
    out = {}
    for key, spec in info.keys.items():
        if key.endswith("_env"):
            default = spec.get("default")
            out[key] = defaults.get(key) or (default if isinstance(default, str) else "")
    return out


def allowed_name(info: ChannelInfo, key: str, name: str) -> bool:
    return confined(name, info.name.upper() + "_", env_keys(info).get(key) or "")


def accepted(info: ChannelInfo, key: str) -> str:
    """The variables `key` may name through the API, in words."""
    prefix = f"a variable starting with {info.name.upper()}_"
    default = env_keys(info).get(key)
    return f"{default} or {prefix}" if default else prefix


def check_names(info: ChannelInfo, values: dict[str, Any], saved: dict[str, Any]) -> None:
    """400 for a `*_env` key of `values` naming a variable outside the adapter's own; a name
    the saved section already holds under that key stays (the admin may have written it)."""
    for key, name in values.items():
        if key.endswith("_env") and not allowed_name(info, key, name) and saved.get(key) != name:
            # The name is not echoed: a secret pasted into the field may look like one.
            raise BadRequest(f"{key}: channel {info.name} may only read {accepted(info, key)} "
                             "(other variables only the admin may name)")


def secret_values(info: ChannelInfo, values: dict[str, Any], secrets: Any) -> dict[str, str]:
    """{variable: value} to store for `secrets` ({"<key>_env": "<value>"}); sets each key's
    variable name in `values` (the section). 400 names the key, never the value."""
    if not isinstance(secrets, dict):
        raise BadRequest('secrets: must be an object of {"<key>_env": "<secret value>"}')
    keys = env_keys(info)
    out: dict[str, str] = {}
    for key, value in secrets.items():
        if key not in keys:
            raise BadRequest(f"secrets.{key}: not a secret key of channel {info.name} "
                             f"(accepted: {', '.join(sorted(keys))})")
        if value is None or value == "":
            continue  # an empty password field keeps what is stored
        if not isinstance(value, str) or len(value) > MAX_SECRET or any(c in value for c in "\r\n\0"):
            raise BadRequest(f"secrets.{key}: must be a single-line string of at most {MAX_SECRET} characters")
        # A key without a catalogue default (matrix refresh_token_env) is named after itself.
        name = values.get(key) or keys[key] or f"{info.name.upper()}_{key.removesuffix('_env').upper()}"
        if not allowed_name(info, key, name):
            raise BadRequest(f"{key}: a secret saved by agentd goes to {accepted(info, key)}, not {name}")
        values[key] = name
        out[name] = value.strip()
    return out
