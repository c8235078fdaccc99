"""Gitter. In February 2023 Gitter became a Matrix homeserver (gitter.im) and shut its own
REST and streaming APIs down (api.gitter.im / stream.gitter.im tokens were invalidated:
https://blog.gitter.im/2023/01/16/gitter-is-going-fully-native-matrix-in-feb-2023/).
What still works, and what this adapter does, is the Matrix client-server API against
Gitter's homeserver: the client base URL is discovered from `homeserver_url`
(`/.well-known/matrix/client`, Matrix server discovery), the bot joins `room_id` (a
Matrix room id `!...:gitter.im` or alias `#...:gitter.im`), long-polls `/sync` and
answers messages in that room. `token_env` names a Matrix access token of the bot's
Gitter (Matrix) account."""

from __future__ import annotations

import re
from urllib.parse import quote

from agentd.channels.adapter import ChannelError, Conversation
from agentd.channels.adapters.matrix import MatrixAdapter

LEGACY_ID = re.compile(r"^[0-9a-f]{24}$")


class GitterAdapter(MatrixAdapter):
    def prepare(self) -> None:
        token = self.env("token_env")
        room = str(self.settings.get("room_id") or "").strip()
        if not room:
            raise ChannelError("room_id is not set (a Matrix room id !...:gitter.im or alias #...:gitter.im)")
        if LEGACY_ID.match(room):
            raise ChannelError(f"room_id {room} is a legacy Gitter id: Gitter's own API is gone since 2023; "
                               "use the room's Matrix id (!...:gitter.im) or alias (#...:gitter.im)")
        server = str(self.settings.get("homeserver_url") or "https://gitter.im").rstrip("/")
        self.client(token, self._discover(server))
        self.user_id = ""
        if room.startswith("#"):
            room = str(self.http.json("GET", f"{self.base}/directory/room/{quote(room, safe='')}",
                                      retries=1)["room_id"])
        self.room = room
        # Joining a room the bot is already in is a no-op; without it /sync shows nothing.
        self.http.request("POST", f"{self.base}/join/{quote(room, safe='')}", json={}, retries=1)

    def _discover(self, server: str) -> str:
        """The client API base URL the server's well-known document names (else the server)."""
        try:
            answer = self.http.json("GET", f"{server}/.well-known/matrix/client", retries=0,
                                    headers={"Authorization": None})  # the token is for the homeserver
            return str(answer["m.homeserver"]["base_url"]).rstrip("/")
        except (ChannelError, KeyError, TypeError):
            return server

    def _handle(self, room_id: str, event: dict) -> None:  # type: ignore[type-arg]
        if room_id == self.room:  # the configured room only: the account may sit in others
            super()._handle(room_id, event)

    def test_target(self, override: str = "") -> Conversation:
        if not override and not hasattr(self, "room"):
            self.prepare()
        return Conversation(self.name, override or self.room)


ADAPTER = GitterAdapter
