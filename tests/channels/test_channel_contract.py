"""The channel contract (tests/channel_contract.py) for every adapter in its table: through
the real daemon, a user's message answered once, a sender outside allowed_users audited and
never answered, a 429 retried no sooner than its Retry-After, the platform restarted and the
adapter reconnecting, DELETE stopping every read; and in this process, stop() ending every
thread the adapter started. Then the checks the Meta webhook adapters share
(tests/meta_webhook.py). What is particular to one platform is in its own
tests/test_channel_<name>.py."""

from __future__ import annotations

import pytest

import channel_contract as contract
import meta_webhook
from channel_contract import CASES
from channel_fixtures import start_channel_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fake_llm):
    """A daemon of this module's own. A channel's cursor outlives its removal, and the tests in
    the adapters' files that check history is not answered need a daemon where their adapter
    has not run yet."""
    started = start_channel_daemon(tmp_path_factory.mktemp("contract"), fake_llm, env=contract.ENV)
    yield started
    started.stop()


def adapters(check: str) -> list:
    """Every adapter of the table the check applies to, named by the adapter."""
    return [pytest.param(case, id=name) for name, case in CASES.items() if check not in case.exempt]


@pytest.fixture
def fake(daemon, case):
    yield from contract.serve(daemon, case)


@pytest.mark.parametrize("case", adapters("round_trip"))
def test_round_trip(daemon, case, fake):
    contract.round_trip(daemon, case, fake)


@pytest.mark.parametrize("case", adapters("refusal"))
def test_allow_list(daemon, case, fake):
    contract.refusal(daemon, case, fake)


@pytest.mark.parametrize("case", adapters("rate_limited"))
def test_rate_limit(daemon, case, fake):
    contract.rate_limited(daemon, case, fake)


# The overrides are read by the one inbound path all adapters share; these platforms each
# answer differently (threads, topics, HTML, mrkdwn), so the reply is checked on each.
OVERRIDES = ("telegram", "matrix", "slack", "discord", "zulip", "rocketchat")


@pytest.mark.parametrize("case", [pytest.param(CASES[name], id=name) for name in OVERRIDES])
def test_overrides(daemon, case, fake, fake_llm):
    contract.overrides(daemon, case, fake, fake_llm)


@pytest.mark.parametrize("case", [pytest.param(case, id=name) for name, case in CASES.items() if case.group_say])
def test_group_policies(daemon, case, fake, fake_llm):
    contract.group_policies(daemon, case, fake, fake_llm)


# The adapters that take the bot's mention out of the text.
MULTILINE = ("zulip", "rocketchat", "nextcloud", "twist", "discourse", "reddit", "bluesky")


@pytest.mark.parametrize("case", [pytest.param(CASES[name], id=name) for name in MULTILINE])
def test_multiline_text_reaches_the_model_as_written(daemon, case, fake, fake_llm):
    contract.multiline(daemon, case, fake, fake_llm)


@pytest.mark.parametrize("case", adapters("reconnect_and_stop"))
def test_reconnect_and_stop(daemon, case, fake):
    contract.reconnect_and_stop(daemon, case, fake)


@pytest.mark.parametrize("case", adapters("threads_end"))
def test_threads_end(case, fake):
    contract.threads_end(case, fake)



# -- the Meta webhook adapters (Messenger, WhatsApp Cloud) ---------------------------------------
META = [pytest.param(platform, id=name) for name, platform in meta_webhook.PLATFORMS.items()]


@pytest.fixture
def hook(daemon, platform):
    yield from meta_webhook.serve(daemon, platform)


@pytest.mark.parametrize("platform", META)
def test_meta_verification_handshake(platform, hook):
    meta_webhook.check_verification_handshake(platform, hook)


@pytest.mark.parametrize("platform", META)
def test_meta_forged_signature_is_refused_before_the_agent(platform, hook, fake_llm):
    meta_webhook.check_forged_signature_refused(platform, hook, fake_llm)


@pytest.mark.parametrize("platform", META)
def test_meta_allow_list_and_429(daemon, platform, hook):
    meta_webhook.check_allow_list_and_429(daemon, platform, hook)


@pytest.mark.parametrize("platform", META)
def test_meta_stop_closes_the_listener(daemon, platform, hook):
    meta_webhook.check_stop_closes_the_listener(daemon, platform, hook)
