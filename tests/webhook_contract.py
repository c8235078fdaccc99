"""Shared checks for the enterprise webhook adapters (teams, google_chat, feishu,
dingtalk): the real adapter class in this process, started on a free port, one signed
request delivered, then stop() ends every thread and closes the listener."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import pytest
import requests

from channel_fixtures import wait_for


def threads_end(name: str, settings: dict[str, Any], env: dict[str, str],
                post: Callable[[str], requests.Response], port: int) -> None:
    """start(); `post(url)` sends one platform request that must reach deliver();
    stop() leaves no thread of the adapter alive and the port closed."""
    from agentd.channels import adapters
    from agentd.channels.adapter import ChannelContext
    from agentd.channels.catalog import ChannelCatalog, settings_for

    got: list = []
    ctx = ChannelContext(name, "127.0.0.1", deliver=got.append, audit=lambda *a, **k: None,
                         load_state=dict, save_state=lambda s: None)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        info = ChannelCatalog.load().get(name)
        adapter = adapters.load(name)(ctx, settings_for(info, {**settings, "webhook_port": port}))
        adapter.start()
        try:
            assert adapter.health()
            response = post(f"http://127.0.0.1:{port}/hook")
            assert response.status_code == 200, response.text
            wait_for(lambda: got, what="inbound message")
        finally:
            adapter.stop()
        assert adapter.threads_alive() == 0 and not adapter.health()
        assert not [t for t in threading.enumerate() if t.name.startswith(f"channel-{name}-") and t.is_alive()]
        with pytest.raises(requests.ConnectionError):
            post(f"http://127.0.0.1:{port}/hook")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
