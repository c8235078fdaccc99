"""A fake Docker Engine API on a unix socket: the endpoints docker_exec uses, as Docker documents them.

POST /containers/create (404 "No such image" for an image it does not hold), POST
/containers/{id}/start (runs the container's Cmd as a local process), POST
/containers/{id}/wait, GET /containers/{id}/json, GET /containers/{id}/logs (the
multiplexed stream of a container without a TTY), POST /containers/{id}/kill and
DELETE /containers/{id}. Every request is logged; live containers are in `containers`.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socketserver
import struct
import subprocess
import threading
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up waiting (docker_exec's deadline) closed its socket


class FakeDockerEngine:
    def __init__(self, path: str, images: tuple[str, ...] = ("debian:bookworm-slim",)) -> None:
        self.path = path
        self.images = set(images)
        self.requests: list[dict[str, Any]] = []
        self.containers: dict[str, dict[str, Any]] = {}
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def address_string(self) -> str:
                return "unix"

            def _reply(self, status: int, body: Any = None, raw: bytes | None = None,
                       content_type: str = "application/json") -> None:
                data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                parts = split.path.strip("/").split("/")
                if parts and parts[0].startswith("v1."):
                    parts = parts[1:]
                engine.requests.append({"method": self.command, "path": "/" + "/".join(parts),
                                        "query": {k: v[-1] for k, v in parse_qs(split.query).items()},
                                        "json": body})
                status, answer, raw, ctype = engine.route(self.command, parts, body)
                self._reply(status, answer, raw, ctype)

            do_GET = do_POST = do_DELETE = _handle  # noqa: N815 - stdlib names

        if os.path.exists(path):
            os.unlink(path)
        self.server = _Server(path, Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def route(self, method: str, parts: list[str], body: Any) -> tuple[int, Any, bytes | None, str]:
        if method == "POST" and parts == ["containers", "create"]:
            if body["Image"] not in self.images:
                return 404, {"message": f"No such image: {body['Image']}"}, None, "application/json"
            cid = uuid.uuid4().hex * 2
            self.containers[cid] = {"config": body, "proc": None}
            return 201, {"Id": cid, "Warnings": []}, None, "application/json"
        if len(parts) < 2 or parts[0] != "containers" or parts[1] not in self.containers:
            return 404, {"message": "No such container"}, None, "application/json"
        container = self.containers[parts[1]]
        action = parts[2] if len(parts) > 2 else ""
        if method == "POST" and action == "start":
            container["proc"] = subprocess.Popen(container["config"]["Cmd"], stdout=subprocess.PIPE,
                                                 stderr=subprocess.PIPE, start_new_session=True)
            return 204, None, None, "application/json"
        if method == "POST" and action == "wait":
            return 200, {"StatusCode": container["proc"].wait(), "Error": None}, None, "application/json"
        if method == "GET" and action == "json":
            return 200, {"Id": parts[1], "Config": {**container["config"], "Tty": False}}, None, "application/json"
        if method == "GET" and action == "logs":
            out, err = container.setdefault("output", container["proc"].communicate())
            frames = b"".join(struct.pack(">BxxxL", kind, len(data)) + data
                              for kind, data in ((1, out), (2, err)) if data)
            return 200, None, frames, "application/vnd.docker.raw-stream"
        if method == "POST" and action == "kill":  # the whole container: its process group
            os.killpg(container["proc"].pid, signal.SIGKILL)
            return 204, None, None, "application/json"
        if method == "DELETE" and not action:
            proc = self.containers.pop(parts[1])["proc"]
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return 204, None, None, "application/json"
        return 404, {"message": f"page not found: {method} {'/'.join(parts)}"}, None, "application/json"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for container in self.containers.values():
            if container["proc"] is not None and container["proc"].poll() is None:
                container["proc"].kill()
