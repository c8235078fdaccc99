"""Teams adapter against a fake Bot Framework: activities with a valid Bot Connector JWT
reach the agent and are answered as replies through the Connector API with a cached
client-credentials token; every way a token can be wrong (missing, foreign key, HS256,
issuer, audience, expired, serviceUrl mismatch, key not endorsing the channel) is 401
before the agent; allowed_tenants and allow-list refusals; 429 retried; stop."""

from __future__ import annotations

import json
import time

import pytest
import requests
import responses

from channel_fixtures import CHANNEL_ENV, audit, channel, configure, remove, wait_active, wait_for  # noqa: F401
from channel_fixtures import channel_daemon, stop_closes_the_listener  # noqa: F401
from fakes.teams import FakeBotFramework, new_key
from support import free_port
from webhook_contract import threads_end

APP_ID, PASSWORD = "a1b2c3d4-0000-4000-8000-000000000001", CHANNEL_ENV["TEAMS_APP_PASSWORD"]


def keys(fake, port, **extra):  # type: ignore[no-untyped-def]
    return {"app_id": APP_ID, "webhook_port": port, "service_url": fake.service_url,
            "openid_url": f"{fake.url}/v1/.well-known/openidconfiguration",
            "token_url": f"{fake.url}/botframework.com/oauth2/v2.0/token", **extra}


@pytest.fixture
def teams(channel_daemon):
    fake, port = FakeBotFramework(APP_ID, PASSWORD).start(), free_port()
    configure(channel_daemon, "teams", default_agent="helper", **keys(fake, port))
    wait_active(channel_daemon, "teams")
    yield fake, f"http://127.0.0.1:{port}/api/messages", port
    remove(channel_daemon, "teams")
    fake.stop()


def post(url: str, activity: dict, token: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return requests.post(url, data=json.dumps(activity), headers={"Content-Type": "application/json", **headers},
                         timeout=5)


def test_message_is_answered_as_a_reply(channel_daemon, teams):
    fake, url, _ = teams
    assert channel(channel_daemon, "teams")["active"] is True
    first = fake.activity("hello teams", "ann")
    assert post(url, first, fake.token()).status_code == 200
    wait_for(lambda: fake.sent, what="reply")
    channel_msg = fake.activity("<at>HelperBot</at> in the channel", "bob", "channel", "19:chan@thread.tacv2")
    assert post(url, channel_msg, fake.token()).status_code == 200
    wait_for(lambda: len(fake.sent) == 2, what="channel reply")
    time.sleep(0.3)
    reply = fake.sent[0]
    assert (reply["conversation"], reply["reply_to"]) == ("a:1ann", first["id"])
    assert reply["activity"] == {"type": "message", "text": "echo: hello teams", "textFormat": "markdown",
                                 "conversation": {"id": "a:1ann"}, "from": first["recipient"],
                                 "replyToId": first["id"], "recipient": {"id": "29:ann", "name": "Ann"}}
    assert (fake.sent[1]["conversation"], fake.sent[1]["activity"]["text"]) == \
        ("19:chan@thread.tacv2", "echo: in the channel")
    assert len(fake.issued) == 1 and fake.jwks_fetches == 1  # token and keys cached
    assert audit(channel_daemon, "channel.outbound", "teams")[0]["detail"]["message_id"] == fake.sent[1]["id"]
    response = channel_daemon.post("/api/channels/teams/test", json={"message": "proactive", "chat_id": "a:1ann"})
    assert response.status_code == 200, response.text
    assert (fake.sent[-1]["reply_to"], fake.sent[-1]["activity"]["text"]) == ("", "proactive")


def test_bad_tokens_are_refused_before_the_agent(channel_daemon, teams, fake_llm):
    fake, url, _ = teams
    before = len(fake_llm.requests)
    activity = fake.activity("forged", "mallory")
    rogue = new_key()
    now = int(time.time())
    cases = {
        "no header": None,
        "not a JWT": "abc.def",
        "foreign key, same kid": fake.token(key=rogue),
        "foreign key, unknown kid": fake.token(key=rogue, kid="rogue-kid"),
        "HS256 with a guessed secret": fake.token(key="secret-secret-secret-secret-32by", algorithm="HS256"),
        "wrong issuer": fake.token(iss="https://sts.windows.net/evil/"),
        "wrong audience": fake.token(aud="some-other-bot"),
        "expired beyond the leeway": fake.token(exp=now - 600, nbf=now - 4000, iat=now - 4000),
        "serviceUrl claim elsewhere": fake.token(service_url="https://evil.example.com/"),
    }
    for what, token in cases.items():
        response = post(url, activity, token)
        assert response.status_code == 401, what
        assert response.json() == {"error": "invalid signature"}
    # A key that does not endorse the activity's channel.
    response = post(url, fake.activity("forged", "mallory", channel="slack"), fake.token())
    assert response.status_code == 401
    time.sleep(0.3)
    assert len(fake_llm.requests) == before and fake.sent == []
    assert audit(channel_daemon, "channel.refused", "teams")[0]["detail"]["reason"] == "bad signature"


def test_tenants_allow_list_and_429(channel_daemon, teams):
    fake, url, port = teams
    # No typing activity: the scripted 429 is for the reply.
    configure(channel_daemon, "teams", **keys(fake, port, allowed_tenants=["tenant-1"], allowed_users=["29:vip"],
                                              overrides={"typing_mode": "never"}))
    wait_active(channel_daemon, "teams")
    fake.throttle = [1]
    asked = time.time()
    assert post(url, fake.activity("other tenant", "vip", tenant="tenant-2"), fake.token()).status_code == 200
    assert post(url, fake.activity("intruder", "bad"), fake.token()).status_code == 200
    assert post(url, fake.activity("member", "vip"), fake.token()).status_code == 200
    wait_for(lambda: fake.sent, what="reply after 429")
    time.sleep(0.3)
    assert [s["activity"]["text"] for s in fake.sent] == ["echo: member"]
    assert fake.throttle == [] and fake.sent[0]["at"] - asked >= 1.0
    refused = [e["detail"] for e in audit(channel_daemon, "channel.refused", "teams")[:2]]
    assert sorted((r["sender"], r["reason"]) for r in refused) == [
        ("29:bad", "sender not in allowed_users"), ("29:vip", "tenant not in allowed_tenants")]


def test_stop_closes_the_listener(channel_daemon, teams):
    fake, url, port = teams
    stop_closes_the_listener(channel_daemon, "teams", lambda: post(url, fake.activity("gone", "ann"), fake.token()),
                             **keys(fake, port))


def test_stop_ends_every_thread_in_process():
    fake = FakeBotFramework(APP_ID, PASSWORD).start()
    try:
        settings = keys(fake, 0)
        del settings["webhook_port"]
        threads_end("teams", settings, CHANNEL_ENV,
                    lambda url: post(url, fake.activity("in process", "ann"), fake.token()), free_port())
    finally:
        fake.stop()


def test_key_rotation_is_picked_up_and_unknown_kids_do_not_flood_the_platform():
    from agentd.channels.adapter import ChannelError
    from agentd.channels.bases.jwtkeys import KeySet
    from agentd.channels.bases.sender import HttpSender

    fake = FakeBotFramework(APP_ID, PASSWORD).start()
    try:
        keys = KeySet(HttpSender(), f"{fake.url}/v1/.well-known/openidconfiguration", "openid", refetch_secs=2.0)
        old, next_key = fake.kid, new_key()  # made before the window opens (slow on a loaded machine)
        assert keys.key(old)[1]["endorsements"] == ["msteams", "webchat"]
        fake.rotate(next_key)
        for _ in range(5):  # made-up (or brand new) kids inside the window: no refetch
            with pytest.raises(ChannelError):
                keys.key(fake.kid)
        assert fake.jwks_fetches == 1
        time.sleep(2.1)
        assert keys.key(fake.kid)[1]["kid"] == fake.kid and fake.jwks_fetches == 2
        with pytest.raises(ChannelError):
            keys.key(old)  # the retired key is gone with the refetch
    finally:
        fake.stop()


@responses.activate
def test_key_documents_of_each_kind_and_a_key_endpoint_that_is_down():
    import datetime

    import jwt as pyjwt
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from agentd.channels.adapter import ChannelError
    from agentd.channels.bases.jwtkeys import KeySet
    from agentd.channels.bases.sender import HttpSender

    def cert(key) -> str:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
        now = datetime.datetime.now(datetime.timezone.utc)
        built = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                 .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                 .sign(key, hashes.SHA256()))
        return built.public_bytes(serialization.Encoding.PEM).decode()

    rsa_key, ec_key = new_key(), ec.generate_private_key(ec.SECP256R1())
    # Google's X.509 map: the RSA certificate serves, the EC one and garbage are skipped.
    responses.get("https://keys.test/x509", json={"r1": cert(rsa_key), "e1": cert(ec_key), "bad": "junk"})
    google = KeySet(HttpSender(), "https://keys.test/x509", "x509")
    public, fields = google.key("r1")
    token = pyjwt.encode({"sub": "s"}, rsa_key, algorithm="RS256", headers={"kid": "r1"})
    assert pyjwt.decode(token, public, algorithms=["RS256"]) == {"sub": "s"} and fields["kid"] == "r1"
    for kid in ("e1", "bad"):
        with pytest.raises(ChannelError, match=f"no signing key '{kid}' at https://keys.test/x509"):
            google.key(kid)
    # A JWKS: only RSA signing keys with a kid.
    rsa_jwk = {**pyjwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True), "kid": "k1"}
    responses.get("https://keys.test/jwks", json={"keys": [
        rsa_jwk, {**rsa_jwk, "kid": "enc", "use": "enc"}, {**rsa_jwk, "kid": ""},
        {**pyjwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True), "kid": "ec"}]})
    plain = KeySet(HttpSender(), "https://keys.test/jwks", "jwks", refetch_secs=0.0)
    assert plain.key("k1")[1] == rsa_jwk
    for kid in ("enc", "ec", ""):
        with pytest.raises(ChannelError):
            plain.key(kid)
    # A key endpoint that fails is asked again only after a pause, not for every request.
    responses.get("https://keys.test/down", status=500)
    down = KeySet(HttpSender(), "https://keys.test/down", "jwks", refetch_secs=0.0)
    for _ in range(3):
        with pytest.raises(ChannelError):
            down.key("k1")
    assert len([c for c in responses.calls if c.request.url.endswith("/down")]) == 2  # (one retry)
    with pytest.raises(ChannelError, match="must be http"):
        KeySet(HttpSender(), "file:///etc/passwd", "jwks").key("k1")


def test_mention_only_answers_messages_that_mention_the_bot(channel_daemon, teams):
    fake, url, port = teams
    configure(channel_daemon, "teams", default_agent="helper",
              **keys(fake, port, overrides={"group_policy": "mention-only", "dm_policy": "mention-only"}))
    wait_active(channel_daemon, "teams")
    assert post(url, fake.activity("no mention here", "ann"), fake.token()).status_code == 200
    wait_for(lambda: any(e["detail"]["reason"] == "dm_policy is mention-only and the bot was not mentioned"
                         for e in audit(channel_daemon, "channel.refused", "teams")), what="refusal")
    mention = fake.activity("<at>HelperBot</at> now with a mention", "ann")
    assert post(url, mention, fake.token()).status_code == 200
    wait_for(lambda: fake.sent, what="reply")
    assert [s["activity"]["text"] for s in fake.sent] == ["echo: now with a mention"]
