"""Nostr adapter against fake relays (NIP-01 over WebSocket; the relays check the
signatures of what the bot publishes): an encrypted DM (NIP-04) reaches the agent and the
answer comes back as an encrypted DM signed by the bot; a note mentioning the bot is
answered with a NIP-10 reply; forged events are dropped and audited; several relays (an
event from two relays answered once, replies published to both); nsec keys; allow-list by
npub; a restart and a reconfiguration answer nothing twice; lifecycle reactions (NIP-25, taken
back with NIP-09) on notes and never on direct messages. The shared checks (round trip,
allow-list, `rate-limited:` refusals retried, reconnect, stop, threads) run in
tests/channels/test_channel_contract.py."""

from __future__ import annotations

import time

import pytest

import channel_contract as contract
from channel_contract import daemon  # noqa: F401 - module fixture
from channel_fixtures import CHANNEL_ENV, channel, configure, wait_active, wait_for
from fakes.nostr import FakeRelay, signed, user_pubkey, user_secret

BOT = contract.NOSTR_BOT
CASE = contract.CASES["nostr"]


def setup(daemon, fake, **overrides):  # type: ignore[no-untyped-def]
    configure(daemon, "nostr", default_agent="helper", **{**CASE.config(fake), **overrides})
    wait_active(daemon, "nostr")


@pytest.fixture
def fake(daemon):  # noqa: F811
    yield from contract.serve(daemon, CASE)


def test_encrypted_dm_round_trip(daemon, fake):  # noqa: F811
    ann = contract.round_trip(daemon, CASE, fake)
    reply = fake.sent[0]
    assert reply["kind"] == 4 and reply["pubkey"] == BOT and reply["tags"] == [["p", ann]]
    assert "echo" not in reply["content"] and "?iv=" in reply["content"]  # encrypted on the wire
    assert fake.rejected == []  # the relay verified the bot's id and signature


def test_note_mention_gets_a_threaded_reply(daemon, fake):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    root = signed(user_secret("carol"), 1, "a thread", [])
    note = signed(user_secret("bob"), 1, f"hey nostr:{npub_of(BOT)} what's up",
                  [["e", root["id"], "", "root"], ["p", BOT]])
    fake.publish(note)
    wait_for(lambda: fake.replies(user_pubkey("bob")), what="note reply")
    reply = fake.sent[-1]
    assert reply["kind"] == 1 and reply["content"] == "echo: hey  what's up"
    assert reply["tags"] == [["e", root["id"], "", "root"], ["e", note["id"], "", "reply"],
                             ["p", user_pubkey("bob")]]


def test_forged_events_are_dropped(daemon, fake, fake_llm):  # noqa: F811
    contract.setup(daemon, CASE, fake)
    before = len(fake_llm.requests)
    tampered = fake.dm("mallory", "original")
    tampered["created_at"] += 1  # the id no longer matches the content
    stolen = fake.dm("mallory", "signed by someone else")
    stolen["sig"] = signed(user_secret("bob"), 4, "x", [])["sig"]
    forged_id = dict(fake.dm("mallory", "id recomputed, signature not"), id="ab" * 32)
    for event in (tampered, stolen, forged_id):
        fake.publish(event)  # a relay that does not check (it happens) passes them on
    wait_for(lambda: len([e for e in contract.audit(daemon, "channel.refused", "nostr")
                          if e["detail"].get("reason") == "bad signature"]) >= 3, what="refusals")
    time.sleep(0.3)
    assert fake.sent == [] and len(fake_llm.requests) == before


def test_several_relays_answer_once_and_publish_everywhere(daemon, fake):  # noqa: F811
    second = FakeRelay(BOT).start()
    try:
        setup(daemon, fake, relays=[f"ws://127.0.0.1:{fake.port}/", f"ws://127.0.0.1:{second.port}/"])
        wait_for(lambda: len(fake.polls) and len(second.polls), what="both subscribed")
        event = fake.dm("ann", "on two relays")
        fake.publish(event)
        second.publish(event)
        wait_for(lambda: fake.replies(user_pubkey("ann")) and second.replies(user_pubkey("ann")), what="replies")
        time.sleep(0.5)
        assert fake.replies(user_pubkey("ann")) == second.replies(user_pubkey("ann")) == ["echo: on two relays"]
        assert fake.sent[0]["id"] == second.sent[0]["id"]
        second.stop()  # one relay down: still active, still answering through the other
        ann = fake.user_says("ann", "one relay left")
        wait_for(lambda: "echo: one relay left" in fake.replies(ann), what="reply through one relay")
        assert channel(daemon, "nostr")["active"] is True
    finally:
        second.stop()


def test_nsec_key_and_npub_allow_list(daemon, fake):  # noqa: F811
    setup(daemon, fake, private_key_env="NOSTR_NSEC", allowed_users=[npub_of(user_pubkey("ann"))])
    fake.user_says("mallory", "not me")
    ann = fake.user_says("ann", "npub allowed")
    wait_for(lambda: fake.replies(ann), what="reply")
    assert fake.replies(ann) == ["echo: npub allowed"] and fake.replies(user_pubkey("mallory")) == []
    assert fake.sent[0]["pubkey"] == BOT  # the nsec is the same key


def test_bad_key_fails_the_start(daemon, fake):  # noqa: F811
    configure(daemon, "nostr", private_key_env="NOSTR_BAD_KEY", relays=[f"ws://127.0.0.1:{fake.port}/"])
    failed = wait_for(lambda: contract.audit(daemon, "channel.start_failed", "nostr"), what="start failure")
    assert "NOSTR_BAD_KEY" in failed[0]["detail"]["error"] and CHANNEL_ENV["NOSTR_BAD_KEY"] not in str(failed)
    assert channel(daemon, "nostr")["active"] is False


def test_restart_reconnect_and_stop(daemon, fake):  # noqa: F811
    contract.round_trip(daemon, CASE, fake)
    # reconnect_and_stop reconfigures (a new adapter, cursor from the store), then restarts
    # the relay; both times the relay sends its stored events again: none is answered twice.
    contract.reconnect_and_stop(daemon, CASE, fake)
    assert fake.replies(user_pubkey("ann")) == ["echo: hello nostr", "echo: after restart"]


def test_nip19_vectors():
    """The bech32 keys the tests use (npub allow-lists) against NIP-19's own examples."""
    from agentd.channels.adapters.nostr_crypto import bech32_decode, npub, private_key
    assert npub("7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e") == \
        "npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg"
    assert private_key("nsec1vl029mgpspedva04g90vltkh6fvh240zqtv9k0t9af8935ke9laqsnlfe5").hex() == \
        "67dea2ed018072d675f5415ecfaed7d2597555e202d85b3d65ea4e58d2d92ffa"
    with pytest.raises(ValueError):
        bech32_decode("npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptf")  # checksum


def npub_of(pubkey: str) -> str:
    from agentd.channels.adapters.nostr_crypto import npub
    return npub(pubkey)


def test_test_message_is_an_encrypted_dm(daemon, fake):  # noqa: F811
    setup(daemon, fake)
    ann = user_pubkey("ann")
    answer = daemon.post("/api/channels/nostr/test", json={"message": "ping", "chat_id": npub_of(ann)})
    assert answer.status_code == 200, answer.text
    assert fake.replies(ann) == ["ping"] and fake.sent[0]["kind"] == 4
    assert daemon.post("/api/channels/nostr/test", json={"message": "ping", "chat_id": "nobody"}).status_code == 400


def test_lifecycle_reactions_on_notes_and_never_on_direct_messages(daemon, fake):  # noqa: F811
    setup(daemon, fake, overrides={"lifecycle_reactions": True})
    note = signed(user_secret("bob"), 1, f"nostr:{npub_of(BOT)} react to me", [["p", BOT]])
    fake.publish(note)
    wait_for(lambda: fake.replies(user_pubkey("bob")), what="note reply")

    def reactions() -> list[dict]:
        return [e for e in fake.events if e["kind"] == 7 and e["pubkey"] == BOT]
    wait_for(lambda: [e["content"] for e in reactions()] == ["✅"], what="👀 taken back, ✅ left")
    assert reactions()[0]["tags"] == [["e", note["id"]], ["p", user_pubkey("bob")], ["k", "1"]]
    assert [(e["kind"], e["content"]) for e in fake.deleted] == [(7, "👀")]
    deletion = next(e for e in fake.sent if e["kind"] == 5)
    assert deletion["tags"] == [["e", fake.deleted[0]["id"]], ["k", "7"]]
    assert fake.rejected == []  # the relay verified the reaction's and the deletion's signatures
    # A direct message gets its answer and no public reaction.
    ann = fake.user_says("ann", "private question")
    wait_for(lambda: fake.replies(ann), what="DM reply")
    time.sleep(0.3)
    assert [e["content"] for e in reactions()] == ["✅"]
