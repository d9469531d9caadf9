"""OpenAIBackend over real HTTP against FakeOpenAIServer, through LLMClient."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time

import pytest

from engine.llm.base import LLMError, LLMRequest
from engine.llm.client import LLMClient, RetryPolicy
from engine.llm.openai_backend import (
    MISSING_CREDENTIALS,
    OpenAIBackend,
    retry_after_seconds,
)
from tests.support.fake_openai import FakeOpenAIServer, default_responder

KEY = "sk-test-SECRET-7f3a9c2e"


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.fixture(autouse=True, params=["aiohttp", "httpx"])
def transport(request, monkeypatch):
    """Every test runs on both of the SDK's transports: aiohttp (the default, from the
    `openai[aiohttp]` extra) and httpx (without the extra, or SEMBACK_HTTP_TRANSPORT=httpx)."""
    if request.param == "httpx":
        monkeypatch.setenv("SEMBACK_HTTP_TRANSPORT", "httpx")
    else:
        monkeypatch.delenv("SEMBACK_HTTP_TRANSPORT", raising=False)
    return request.param


def test_the_backend_uses_the_transport_it_was_given(transport):
    with FakeOpenAIServer() as server:
        backend = OpenAIBackend(base_url=server.base_url)
        assert backend.transport == transport
        record, _, _ = call_once(server.base_url)
    assert record.error is None and len(server.requests) == 1


def test_a_base_url_with_credentials_goes_through_httpx():
    # aiohttp refuses a URL's user:password beside the key's Authorization header
    assert OpenAIBackend(base_url="http://user:pw@127.0.0.1:9/v1").transport == "httpx"


def call_once(base_url: str, *, key: str | None = KEY, max_retries: int = 4,
              timeout: float = 5.0, messages=(("user", "hi"),)):
    """One client call; returns (record, backend repr, seconds taken)."""

    async def go():
        backend = OpenAIBackend(base_url=base_url, api_key=key)
        client = LLMClient(forward_backend=backend, forward_model="m",
                           retry=RetryPolicy(max_retries=max_retries, base_delay=0.01,
                                             timeout=timeout))
        started = time.perf_counter()
        try:
            record = await client.call(client.request("forward", list(messages)), step=0)
        finally:
            await client.aclose()
        return record, repr(backend), time.perf_counter() - started

    return asyncio.run(go())


def test_success_sends_messages_and_reports_tokens():
    with FakeOpenAIServer() as server:
        record, _, _ = call_once(server.base_url)
    body = server.requests[0]
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["model"] == "m"
    assert body["temperature"] == 0.0 and body["max_tokens"] == 512
    assert record.error is None and record.retries == 0
    assert record.response == default_responder(body)
    assert "<output>42</output>" in record.response
    assert record.prompt_tokens > 0 and record.completion_tokens > 0
    assert server.authorizations == [f"Bearer {KEY}"]


def test_server_error_is_retried():
    with FakeOpenAIServer(faults=[("status", 500)]) as server:
        record, _, _ = call_once(server.base_url)
    assert len(server.requests) == 2
    assert record.retries == 1 and record.error is None
    assert "<output>42</output>" in record.response


def test_rate_limit_honours_retry_after(monkeypatch):
    # the delay the client chose, not the time it took: base_delay is 0.01 s, so a wait of
    # 0.6 s can only come from the server's Retry-After
    chosen: list[float] = []
    policy_delay = RetryPolicy.delay

    def recording(self, attempt, retry_after, rng):
        chosen.append(policy_delay(self, attempt, retry_after, rng))
        return chosen[-1]

    monkeypatch.setattr(RetryPolicy, "delay", recording)
    with FakeOpenAIServer(faults=[("status", 429, 0.6)]) as server:
        record, _, _ = call_once(server.base_url)
    assert record.retries == 1 and record.error is None
    assert chosen == [0.6] and len(server.requests) == 2


def test_hang_past_timeout_is_retried_then_recorded():
    with FakeOpenAIServer(faults=[("hang", 5.0)] * 3) as server:
        record, _, _ = call_once(server.base_url, max_retries=2, timeout=0.3)
        assert len(server.requests) == 3
    assert record.retries == 2
    assert record.response == ""
    assert record.error.startswith("gave up after 2 retries") and "timed out" in record.error


def test_one_hang_then_success():
    with FakeOpenAIServer(faults=[("hang", 5.0)]) as server:
        record, _, _ = call_once(server.base_url, timeout=0.3)
    assert record.retries == 1 and record.error is None and record.response


def test_empty_content_is_retried():
    with FakeOpenAIServer(faults=[("empty",)]) as server:
        record, _, _ = call_once(server.base_url)
    assert len(server.requests) == 2
    assert record.retries == 1 and record.error is None and record.response


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_permanent_failure_is_recorded_not_raised(status):
    with FakeOpenAIServer(faults=[("status", status)]) as server:
        record, _, _ = call_once(server.base_url)
    assert len(server.requests) == 1
    assert record.retries == 0 and record.response == ""
    assert f"({status})" in record.error and "\n" not in record.error


def test_missing_key_and_base_url_is_a_clear_error():
    with pytest.raises(LLMError) as info:
        OpenAIBackend()
    message = str(info.value)
    assert message == MISSING_CREDENTIALS
    # no flag: which one helps is the command's (tests/test_cli_errors.py)
    assert "OPENAI_API_KEY" in message and "--" not in message
    assert "\n" not in message


def test_environment_supplies_url_and_key(monkeypatch):
    with FakeOpenAIServer() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", KEY)

        async def go():
            backend = OpenAIBackend()
            try:
                return await backend.complete(LLMRequest(messages=(("user", "x"),),
                                                         model="m", purpose="forward"))
            finally:
                await backend.aclose()

        reply = asyncio.run(go())
    assert reply.text and server.authorizations == [f"Bearer {KEY}"]


def test_base_url_without_key_sends_placeholder():
    with FakeOpenAIServer() as server:
        record, _, _ = call_once(server.base_url, key=None)
    assert record.error is None
    assert server.authorizations == ["Bearer not-needed"]


def test_unreachable_server_is_recorded_after_bounded_retries():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    record, _, _ = call_once(f"http://127.0.0.1:{port}/v1", max_retries=2)
    assert record.retries == 2 and record.response == ""
    assert "gave up after 2 retries" in record.error and "cannot connect" in record.error
    assert "Traceback" not in record.error


def test_api_key_never_leaks():
    echo = f"Incorrect API key provided: {KEY}. You can find your key at ..."
    with FakeOpenAIServer(faults=[("status", 401, None, echo)]) as server:
        record, backend_repr, _ = call_once(server.base_url)
        assert server.authorizations == [f"Bearer {KEY}"]  # it did reach the server

        async def direct():
            backend = OpenAIBackend(base_url=server.base_url, api_key=KEY)
            server.add_fault("status", 500, None, echo)
            try:
                await backend.complete(LLMRequest(messages=(("user", "x"),), model="m",
                                                  purpose="forward"))
            except LLMError as exc:
                return exc
            finally:
                await backend.aclose()

        exc = asyncio.run(direct())
    assert "***" in record.error
    texts = [json.dumps(dataclasses.asdict(record)), repr(record), backend_repr,
             str(exc), repr(exc)]
    for text in texts:
        assert KEY not in text
    assert exc.__cause__ is None and exc.__suppress_context__


def test_retry_after_header_forms():
    class Response:
        def __init__(self, headers):
            self.headers = headers

    assert retry_after_seconds(Response({"retry-after": "2"})) == 2.0
    assert retry_after_seconds(Response({"retry-after-ms": "250"})) == 0.25
    assert retry_after_seconds(Response({"retry-after": "soon"})) is None
    assert retry_after_seconds(Response({})) is None
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= retry_after_seconds(Response({"retry-after": future})) <= 31
