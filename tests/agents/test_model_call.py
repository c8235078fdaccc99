"""The model call of a run (agentd/agents/model_call.py), in process, with exact values.

Provider endpoints (where the URL and the key name come from, in which order), and the
call chain: the agent's model, then its fallbacks, over real sockets to the fake LLM and
to a provider that fails on purpose (tests/misbehaving_upstream.py). What is retried on
the next model, what is not (cancelled, timed out, a stream that already delivered text),
the combined error, and the usage handed to metering.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agentd.llm.types import ChatRequest, LLMError, Message, ProviderEndpoint, TextDelta
from misbehaving_upstream import Upstream
from mgrsupport import Env, Recorder, llm_config, manifest, run, fake  # noqa: F401 (fake: a fixture)


@pytest.fixture(scope="module")
def up():
    server = Upstream().start()
    yield server
    server.stop()


@pytest.fixture()
def env(tmp_path: Path, fake, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("MGR_TEST_KEY", "sk-mgr")
    e = Env(tmp_path, llm_config(fake, stream_idle_secs=7))
    yield e
    e.close()


@pytest.fixture()
def mgr(env):
    return env.manager()


# -- endpoints ----------------------------------------------------------------------------------
def test_endpoint_of_a_catalog_provider(mgr, fake, monkeypatch) -> None:
    assert mgr.models.endpoint("openai") == ProviderEndpoint(
        provider="openai", kind="openai", base_url=fake.openai_base, api_key="sk-openai",
        api_key_env="OPENAI_API_KEY", key_required=True, timeout=5.0, stream_idle=7.0)
    anthropic = mgr.models.endpoint("anthropic")
    assert anthropic.kind == "anthropic" and anthropic.base_url == fake.anthropic_base
    monkeypatch.delenv("GROQ_API_KEY", raising=False)
    assert mgr.models.endpoint("groq") == ProviderEndpoint(
        provider="groq", kind="openai", base_url="https://api.groq.com/openai/v1", api_key="",
        api_key_env="GROQ_API_KEY", key_required=True, timeout=5.0, stream_idle=7.0)


def test_endpoint_url_precedence(mgr, fake) -> None:
    assert mgr.models.endpoint("openai", base_url="http://given/v1").base_url == "http://given/v1"
    mgr.models.url_overrides["openai"] = "http://override/v1"
    assert mgr.models.endpoint("openai").base_url == "http://override/v1"
    assert mgr.models.endpoint("openai", base_url="http://given/v1").base_url == "http://given/v1"
    mgr.models.url_overrides["mistral"] = "http://m/v1"
    assert mgr.models.endpoint("openai").base_url == "http://override/v1"
    assert mgr.models.endpoint("mistral").base_url == "http://m/v1"
    assert mgr.models.endpoint("gemini").base_url == fake.gemini_base   # config provider_urls
    assert mgr.models.endpoint("fireworks").base_url == "https://api.fireworks.ai/inference/v1"   # the catalog's


def test_endpoint_key_name_and_whether_one_is_required(mgr) -> None:
    ep = mgr.models.endpoint("openai", api_key_env="MGR_TEST_KEY")
    assert (ep.api_key_env, ep.api_key, ep.key_required) == ("MGR_TEST_KEY", "sk-mgr", True)
    ep = mgr.models.endpoint("ollama")
    assert (ep.api_key_env, ep.api_key, ep.key_required, ep.base_url) == ("", "", False, "http://localhost:11434/v1")
    ep = mgr.models.endpoint("ollama", api_key_env="MGR_TEST_KEY")
    assert (ep.api_key_env, ep.api_key, ep.key_required) == ("MGR_TEST_KEY", "sk-mgr", True)
    ep = mgr.models.endpoint("ollama", api_key_env="MGR_UNSET_KEY_X")
    assert (ep.api_key, ep.key_required) == ("", True)


def test_endpoint_of_a_custom_provider(mgr) -> None:
    ep = mgr.models.endpoint("mine", base_url="http://h/v1")
    assert ep == ProviderEndpoint(provider="mine", kind="openai", base_url="http://h/v1", api_key="", api_key_env="",
                                  key_required=False, timeout=5.0, stream_idle=7.0)
    ep = mgr.models.endpoint("mine", "MGR_TEST_KEY", "http://h/v1")
    assert (ep.api_key, ep.api_key_env, ep.key_required) == ("sk-mgr", "MGR_TEST_KEY", True)
    with pytest.raises(LLMError) as err:
        mgr.models.endpoint("mine")
    assert (err.value.message, err.value.provider, err.value.model, err.value.kind) == \
        ("mine: unknown provider", "mine", "", "bad_request")
    mgr.models.url_overrides["mine"] = "http://o/v1"   # an override alone does not make a provider known
    with pytest.raises(LLMError):
        mgr.models.endpoint("mine")


# -- the call chain -----------------------------------------------------------------------------
def call(mgr, handle, text: str, on_event=None, usage=None, cancel=None):
    return mgr.models.llm_call(handle, usage)(ChatRequest(model="ignored", messages=[Message("user", text)]),
                                        on_event, cancel or threading.Event())


def test_the_agents_model_answers_and_its_usage_is_recorded(env, mgr, fake) -> None:
    env.usage.value = 0.25
    h = mgr.spawn(manifest("one"))
    response = call(mgr, h, "hi there")
    assert (response.text, response.model, response.cost_usd) == ("echo: hi there", "gpt-4o", 0.25)
    assert fake.requests[-1]["json"]["model"] == "gpt-4o"
    assert fake.requests[-1]["headers"]["Authorization"] == "Bearer sk-openai"
    assert env.usage.calls == [(h, "openai", "gpt-4o", response)], "recorded at once without a usage list"


def test_usage_is_deferred_to_the_runs_list_only_when_rows_are_written_with_the_session(env, mgr) -> None:
    h = mgr.spawn(manifest("defer"))
    run(mgr, h, "a")
    assert len(env.usage.calls[-1]) == 4, "no write_usage: recorded at once"
    deferring = env.manager(write_usage=lambda tx, usage: None)
    other = deferring.spawn(manifest("defer2"))
    run(deferring, other, "a")
    assert len(env.usage.calls[-1]) == 5 and env.usage.calls[-1][4] == [], \
        "BUG: a run whose session write takes its usage rows did not collect them"
    rows: list = []
    response = call(mgr, h, "b", usage=rows)
    assert env.usage.calls[-1] == (h, "openai", "gpt-4o", response, rows) and env.usage.calls[-1][4] is rows
    call(mgr, h, "c")
    assert len(env.usage.calls[-1]) == 4


def test_streamed_events_are_forwarded(mgr) -> None:
    h = mgr.spawn(manifest("stream"))
    seen: list = []
    response = call(mgr, h, "[[chunks:3]]", on_event=seen.append)
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "w1 w2 w3" == response.text


def test_a_failing_model_falls_back_to_the_next(env, mgr, fake, up) -> None:
    h = mgr.spawn(manifest("fb", f'base_url = "{up.base("status-500-0")}"\n'
                                 '[[fallback_models]]\nprovider = "openai"\nmodel = "gpt4-mini"\n'))
    before = len(fake.requests)
    seen: list = []
    response = call(mgr, h, "fall back", on_event=seen.append)
    assert (response.text, response.model) == ("echo: fall back", "gpt-4o-mini"), \
        "BUG: the fallback's alias was not resolved or its answer not used"
    assert fake.requests[-1]["json"]["model"] == "gpt-4o-mini" and len(fake.requests) == before + 1
    assert env.usage.calls == [(h, "openai", "gpt-4o-mini", response)]
    assert seen, "the fallback's stream is forwarded too"


def test_the_fallbacks_own_key_and_url(env, mgr, fake, up) -> None:
    h = mgr.spawn(manifest("fbkey", f'base_url = "{up.base("reset")}"\n'
                                    '[[fallback_models]]\nprovider = "mine"\nmodel = "x-model"\n'
                                    f'api_key_env = "MGR_TEST_KEY"\nbase_url = "{fake.openai_base}"\n'))
    response = call(mgr, h, "custom")
    assert response.model == "x-model" and fake.requests[-1]["headers"]["Authorization"] == "Bearer sk-mgr"
    assert env.usage.calls[-1][1:3] == ("mine", "x-model")


def test_one_failure_is_raised_as_it_is(mgr, up) -> None:
    h = mgr.spawn(manifest("single", f'base_url = "{up.base("status-429-3")}"\n'))
    with pytest.raises(LLMError) as err:
        call(mgr, h, "x")
    assert (err.value.kind, err.value.http_status, err.value.retry_after) == ("rate_limit", 429, 3)
    assert not err.value.message.startswith("all models failed")


def test_every_model_failing_gives_one_error_naming_each(env, mgr, up, caplog) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="agentd.agents")
    h = mgr.spawn(manifest("all", f'base_url = "{up.base("status-500-0")}"\n'
                                  '[[fallback_models]]\nprovider = "mine"\nmodel = "m2"\n'
                                  f'base_url = "{up.base("status-429-9")}"\n'
                                  '[[fallback_models]]\nprovider = "other"\nmodel = "m3"\n'))
    with pytest.raises(LLMError) as err:
        call(mgr, h, "x")
    exc = err.value
    warnings = [r.getMessage() for r in caplog.records if r.name == "agentd.agents"]
    assert len(warnings) == 3 and warnings[2] == "model call failed: other: unknown provider"
    assert warnings[0].startswith("model call failed: ") and warnings[1].startswith("model call failed: ")
    assert exc.message == "all models failed: " + "; ".join(w.removeprefix("model call failed: ") for w in warnings)
    assert (exc.provider, exc.model) == ("openai", "gpt-4o"), "provider and model are the first failure's"
    assert (exc.kind, exc.http_status, exc.retry_after) == ("bad_request", None, None), "kind etc. are the last one's"
    assert env.usage.calls == []


def test_the_combined_error_carries_the_last_failures_status(mgr, up) -> None:
    h = mgr.spawn(manifest("last", f'base_url = "{up.base("status-500-0")}"\n'
                                   '[[fallback_models]]\nprovider = "mine"\nmodel = "m2"\n'
                                   f'base_url = "{up.base("status-429-9")}"\n'))
    with pytest.raises(LLMError) as err:
        call(mgr, h, "x")
    assert (err.value.kind, err.value.http_status, err.value.retry_after, err.value.provider) == \
        ("rate_limit", 429, 9, "openai")
    assert err.value.message.startswith("all models failed: ") and err.value.message.count("; ") == 1


def test_a_stream_that_already_delivered_text_is_not_retried_elsewhere(env, mgr, fake, up) -> None:
    h = mgr.spawn(manifest("cut", f'base_url = "{up.base("cut")}"\n'
                                  '[[fallback_models]]\nprovider = "openai"\nmodel = "gpt-4o-mini"\n'))
    before = len(fake.requests)
    seen: list = []
    with pytest.raises(LLMError) as err:
        call(mgr, h, "x", on_event=seen.append)
    assert err.value.kind == "truncated" and len(fake.requests) == before, \
        "BUG: a reply already streamed to the client was continued by another model"


def test_timeouts_and_cancels_are_not_retried_elsewhere(tmp_path, fake, up, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, llm_config(fake, timeout_secs=1))
    try:
        m = e.manager()
        h = m.spawn(manifest("slow", f'base_url = "{up.base("hang")}"\n'
                                     '[[fallback_models]]\nprovider = "openai"\nmodel = "gpt-4o-mini"\n'))
        before = len(fake.requests)
        with pytest.raises(LLMError) as err:
            call(m, h, "x")
        assert err.value.kind == "timeout" and len(fake.requests) == before
        assert not err.value.message.startswith("all models failed"), "BUG: a timeout went on to the fallback"
        cancel = threading.Event()
        threading.Timer(0.2, cancel.set).start()
        with pytest.raises(LLMError) as err:
            call(m, h, "x", cancel=cancel)
        assert err.value.kind == "cancelled" and len(fake.requests) == before
        assert not err.value.message.startswith("all models failed"), "BUG: a cancelled call went on to the fallback"
    finally:
        e.close()


def test_one_deadline_covers_the_fallbacks(tmp_path, fake, up, monkeypatch) -> None:
    import time

    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, llm_config(fake, timeout_secs=2))
    try:
        m = e.manager()
        h = m.spawn(manifest("dl", f'base_url = "{up.base("status-500-0")}"\n'
                                   '[[fallback_models]]\nprovider = "openai"\nmodel = "gpt-4o-mini"\n'))
        response = call(m, h, "[[slow:0.2]] in time")
        assert response.text == "echo: in time"
        started = time.monotonic()
        with pytest.raises(LLMError) as err:
            call(m, h, "[[slow:5]] too late")
        assert err.value.kind == "timeout" and time.monotonic() - started < 4.5
    finally:
        e.close()


def test_the_configured_retries_are_used(mgr, up) -> None:
    import uuid

    fault = f"status-500-0-{uuid.uuid4().hex[:6]}"
    h = mgr.spawn(manifest("noretry", f'base_url = "{up.base(fault)}"\n'))
    with pytest.raises(LLMError):
        call(mgr, h, "x")
    assert len(up.by_fault(fault)) == 1, "retries = 0 in the config: one attempt"


def test_time_spent_on_a_failed_model_counts_against_the_fallback(tmp_path, fake, up, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    e = Env(tmp_path, llm_config(fake, timeout_secs=3))
    try:
        m = e.manager()
        # The agent's model fails after 2 s; the fallback needs 2 s more: past the call's 3 s.
        h = m.spawn(manifest("spent", '[[fallback_models]]\nprovider = "mine"\nmodel = "m2"\n'
                                      f'base_url = "{up.base("chunked-1-3")}"\n'))
        with pytest.raises(LLMError) as err:
            call(m, h, "[[slow:2]] [[fail:500]]", on_event=lambda event: None)
        assert err.value.kind == "timeout", "BUG: each fallback got a fresh deadline"
    finally:
        e.close()
