"""Gitter as it is since 2023: a Matrix homeserver. `FakeGitter` is the fake Matrix
homeserver (tests/fakes/matrix.py) plus what a Gitter bot needs on top: room joins
(`POST /join/{room}`) and alias lookup (`GET /directory/room/{alias}`); `FakeGitterFront` is the gitter.im
web front that only serves the Matrix discovery document
(`/.well-known/matrix/client` -> `m.homeserver.base_url`), pointing at the homeserver.

Follows FakePlatform's contract (`sent`, `throttle`, `polls`, `restart`)."""

from __future__ import annotations

from flask import Flask, jsonify, request

from fakes.http import FakeServer
from fakes.matrix import PREFIX, FakeMatrix

ROOM = "!devroom:gitter.im"
ALIAS = "#acme_dev:gitter.im"


class FakeGitter(FakeMatrix):
    def __init__(self, token: str) -> None:
        super().__init__(token, bot="@helper-bot:gitter.im")
        self.joins: list[str] = []
        app = self.app

        @app.post(PREFIX + "/join/<room>")
        def join(room: str):
            self.joins.append(room)
            return jsonify({"room_id": room})

        @app.get(PREFIX + "/directory/room/<alias>")
        def directory(alias: str):
            if alias != ALIAS:
                return jsonify({"errcode": "M_NOT_FOUND", "error": "Room alias not found"}), 404
            return jsonify({"room_id": ROOM, "servers": ["gitter.im"]})


class FakeGitterFront(FakeServer):
    def __init__(self, homeserver: FakeGitter) -> None:
        app = Flask("fake-gitter-front")
        self.asked: list[dict[str, str]] = []

        @app.get("/.well-known/matrix/client")
        def well_known():
            self.asked.append(dict(request.headers))
            return jsonify({"m.homeserver": {"base_url": homeserver.url}})

        super().__init__(app)
