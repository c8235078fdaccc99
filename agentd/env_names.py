"""The environment variables a request may have the daemon read a secret from.

A channel's `*_env` keys and a cron webhook's `secret_env` name a variable, and the daemon
then uses its value: sends it to the platform, or signs a webhook to a URL of the caller's
choosing with it. A caller short of the admin (a scoped API key, or a run it started) may
therefore name only the feature's own variables: its documented default, or a name with the
feature's prefix; never a provider key, `PATH` or anything else of the environment. The
admin names any, as in a config.toml edited by hand.
"""

from __future__ import annotations

import re

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def confined(name: str, prefix: str, default: str = "") -> bool:
    """Whether a caller short of the admin may name `name`: `default`, or a name starting with `prefix`."""
    return bool(ENV_NAME.match(name)) and (name == default or name.startswith(prefix))
