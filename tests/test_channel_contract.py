"""The channel contract (tests/channel_contract.py) for every adapter in its table: through
the real daemon, a user's message answered once, a sender outside allowed_users audited and
never answered, a 429 retried no sooner than its Retry-After, the platform restarted and the
adapter reconnecting, DELETE stopping every read; and in this process, stop() ending every
thread the adapter started. What is particular to one platform is in its own
tests/test_channel_<name>.py."""

from __future__ import annotations

import pytest

import channel_contract as contract
from channel_contract import CASES, daemon  # noqa: F401 - module fixture


def adapters(check: str) -> list:
    """Every adapter of the table the check applies to, named by the adapter."""
    return [pytest.param(case, id=name) for name, case in CASES.items() if check not in case.exempt]


@pytest.fixture
def fake(daemon, case):  # noqa: F811
    yield from contract.serve(daemon, case)


@pytest.mark.parametrize("case", adapters("round_trip"))
def test_round_trip(daemon, case, fake):  # noqa: F811
    contract.round_trip(daemon, case, fake)


@pytest.mark.parametrize("case", adapters("refusal"))
def test_allow_list(daemon, case, fake):  # noqa: F811
    contract.refusal(daemon, case, fake)


@pytest.mark.parametrize("case", adapters("rate_limited"))
def test_rate_limit(daemon, case, fake):  # noqa: F811
    contract.rate_limited(daemon, case, fake)


@pytest.mark.parametrize("case", adapters("reconnect_and_stop"))
def test_reconnect_and_stop(daemon, case, fake):  # noqa: F811
    contract.reconnect_and_stop(daemon, case, fake)


@pytest.mark.parametrize("case", adapters("threads_end"))
def test_threads_end(case, fake):
    contract.threads_end(case, fake)

