"""docker_exec: one command in a fresh, throw-away container, through the Docker Engine API.

`[tools] container_runtime` names the Engine API's unix socket (Docker's, or Podman's
Docker-compatible one). The docker SDK is imported when the tool first runs. Each call
creates a container from an allowed image (no network unless `container_network`, memory
and CPU limits, all capabilities dropped), starts it, waits for it up to the deadline, reads
its logs and always removes it.
"""

from __future__ import annotations

import importlib.util
import os
import stat
from typing import Any

from agentd.agents.tools.base import ToolContext, ToolError, tool
from agentd.config import ToolsConfig

API_VERSION = "1.41"  # understood by Docker 20.10+ and Podman 3+; no version probe per call
LABEL = "agentd.agent"


def runtime_unavailable(config: ToolsConfig) -> str | None:
    if not config.container_runtime:
        return "no container runtime configured ([tools] container_runtime)"
    if importlib.util.find_spec("docker") is None:
        return "the docker SDK is not installed (pip install 'agentd[containers]')"
    try:
        if not stat.S_ISSOCK(os.stat(config.container_runtime).st_mode):
            return f"{config.container_runtime} is not a socket"
    except OSError:
        return f"container runtime socket {config.container_runtime} not found"
    return None


def _cap(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + f"\n[output truncated at {limit} bytes of {len(data)}]"


@tool("docker_exec", "Execute a command inside a Docker container sandbox. Provides OS-level isolation with "
      "resource limits, network isolation, and capability dropping. Requires a Docker or Podman socket in "
      "[tools] container_runtime.",
      {"command": {"type": "string", "description": "The command to execute inside the container"}},
      ("command",), capability="shell", family="containers", check=runtime_unavailable)
def docker_exec(ctx: ToolContext, args: dict[str, Any]) -> str:
    import docker
    import requests

    cfg = ctx.tools_config
    command = args["command"]
    if not command.strip():
        raise ToolError("empty command")
    image = cfg.container_image
    allowed = cfg.container_allowed_images or [cfg.container_image]
    if image not in allowed:
        raise ToolError(f"image {image} is not in [tools] container_allowed_images ({', '.join(allowed)})")
    client = docker.APIClient(base_url=f"unix://{cfg.container_runtime}", version=API_VERSION,
                              timeout=cfg.container_timeout_secs + 10)
    host_config = client.create_host_config(
        mem_limit=cfg.container_memory_mb * 1024 * 1024, nano_cpus=int(cfg.container_cpus * 1e9),
        network_mode="bridge" if cfg.container_network else "none", cap_drop=["ALL"],
        security_opt=["no-new-privileges"], pids_limit=256)
    container_id = ""
    try:
        try:
            # The container is the sandbox: the command gets a shell inside it.
            created = client.create_container(image, ["sh", "-c", command], host_config=host_config,
                                              network_disabled=not cfg.container_network,
                                              labels={LABEL: ctx.agent_id}, working_dir="/tmp")
        except docker.errors.ImageNotFound:
            raise ToolError(f"image {image} is not present in the container runtime (pull it there first)") from None
        container_id = created["Id"]
        ctx.audit("tool.docker_exec", {"container": container_id[:12], "image": image, "bytes": len(command)})
        client.start(container_id)
        timed_out = False
        try:
            code = client.wait(container_id, timeout=cfg.container_timeout_secs)["StatusCode"]
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            timed_out = True
            client.kill(container_id)
            code = None
        output = client.logs(container_id, stdout=True, stderr=True).decode(errors="replace")
    except docker.errors.APIError as exc:
        raise ToolError(f"container runtime: {exc.explanation or exc}") from None
    except (requests.exceptions.ConnectionError, FileNotFoundError) as exc:
        raise ToolError(f"cannot reach the container runtime at {cfg.container_runtime}: "
                        f"{type(exc).__name__}") from None
    finally:
        if container_id:
            try:
                client.remove_container(container_id, force=True)
            except (docker.errors.APIError, requests.exceptions.RequestException):
                pass
        client.close()
    output = _cap(output, cfg.shell_max_output_bytes)
    if timed_out:
        return f"timed out after {cfg.container_timeout_secs:g}s; the container was killed\n{output}"
    return f"exit code {code}\n{output}"
