"""``OpenAIModel`` through the real ``openai`` SDK against a local Chat Completions server."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fake_providers import (
    SSE,
    FakeProvider,
    Reply,
    local_network_only,
    no_external_network,  # noqa: F401  (autouse guard)
    openai_error,
    openai_stream,
)

from dormant import Agent, LocalSystem, Settings, tool
from dormant.errors import ModelFatal, ModelRetryable
from dormant.messages import (
    EVENT_TOOL_NAME,
    AssistantTurn,
    EventShown,
    Item,
    Summary,
    ToolCall,
    ToolResult,
    UserText,
)
from dormant.models import ModelRequest, ModelSettings, OpenAIModel, ToolSpec
from dormant.models.registry import resolve_model
from dormant.models.retry import complete_with_retry
from dormant.models.wire import RAW_ARGUMENTS, SUMMARY_PREFIX
from dormant.runtime.history import INTERRUPTED
from dormant.stores.base import InboxState, ThreadStatus


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


WEATHER = get_weather.spec()
RESERVED = ToolSpec(EVENT_TOOL_NAME, "must never be offered", {"type": "object", "properties": {}})


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider.openai() as fake:
        yield fake


@pytest.fixture
def model(server: FakeProvider) -> Iterator[OpenAIModel]:
    model = OpenAIModel("gpt-test", base_url=server.base_url, api_key="test-key")
    yield model
    model.close()


def ask(
    text: str = "Weather in Paris?",
    tools: tuple[ToolSpec, ...] = (),
    settings: ModelSettings | None = None,
    items: list[Item] | None = None,
) -> ModelRequest:
    return ModelRequest(
        thread_id="thr_test",
        instructions="You are terse.",
        items=items or [UserText(text=text)],
        tools=tools,
        settings=settings or ModelSettings(),
    )


def retry(
    model: OpenAIModel,
    request: ModelRequest,
    chunks: list[str],
    sleeps: list[float],
    attempts: int = 3,
) -> Any:
    return complete_with_retry(
        model,
        request,
        chunks.append,
        attempts=attempts,
        base_s=0.5,
        max_s=30.0,
        sleep=sleeps.append,
    )


# Replies ------------------------------------------------------------------------------


def test_a_text_reply_streams_its_chunks_and_parses_usage_with_cached_tokens(
    server: FakeProvider, model: OpenAIModel
) -> None:
    server.script(openai_stream(["It is ", "sunny ", "in Paris."], usage=(120, 9, 100)))
    chunks: list[str] = []

    completion = model.complete(ask(), chunks.append)

    assert chunks == ["It is ", "sunny ", "in Paris."]
    assert completion.text == "It is sunny in Paris."
    assert completion.calls == ()
    assert (completion.usage.input_tokens, completion.usage.output_tokens) == (120, 9)
    assert completion.usage.cached_tokens == 100
    [request] = server.requests
    assert request.headers["authorization"] == "Bearer test-key"
    assert request.body == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_model_settings_are_applied_to_each_request(server: FakeProvider) -> None:
    server.script(openai_stream(["ok"]), openai_stream(["ok"]))
    settings = ModelSettings(temperature=0.2, max_tokens=256, timeout_s=7.5)
    modern = OpenAIModel("gpt-test", base_url=server.base_url, api_key="k")
    legacy = OpenAIModel(
        "local", base_url=server.base_url, api_key="k", max_tokens_param="max_tokens"
    )

    modern.complete(ask(settings=settings), lambda _text: None)
    legacy.complete(ask(settings=settings), lambda _text: None)

    first, second = server.requests
    assert first.body["temperature"] == 0.2
    assert first.body["max_completion_tokens"] == 256 and "max_tokens" not in first.body
    assert second.body["max_tokens"] == 256 and "max_completion_tokens" not in second.body
    assert first.headers["x-stainless-read-timeout"] == "7.5"
    modern.close()
    legacy.close()


def test_a_tool_call_is_returned_with_parsed_arguments(
    server: FakeProvider, model: OpenAIModel
) -> None:
    server.script(openai_stream(calls=[("call_1", "get_weather", ['{"ci', 'ty": "Par', 'is"}'])]))

    completion = model.complete(ask(tools=(WEATHER, RESERVED)), lambda _text: None)

    assert completion.calls == (
        ToolCall(call_id="call_1", name="get_weather", args={"city": "Paris"}),
    )
    body = server.bodies[0]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER.parameters,
                "description": "Weather for a city.",
            },
        }
    ]
    assert body["parallel_tool_calls"] is True


def test_parallel_tool_calls_are_all_returned_in_order(
    server: FakeProvider, model: OpenAIModel
) -> None:
    calls = [
        ("call_a", "get_weather", ['{"city":', ' "Oslo"}']),
        ("call_b", "get_weather", ['{"city":', ' "Rome"}']),
        ("call_c", "get_weather", ['{"city":', ' "Lima"}']),
    ]
    server.script(openai_stream(["Checking three cities."], calls, interleave=True))

    completion = model.complete(ask(tools=(WEATHER,)), lambda _text: None)

    assert [(c.call_id, c.args["city"]) for c in completion.calls] == [
        ("call_a", "Oslo"),
        ("call_b", "Rome"),
        ("call_c", "Lima"),
    ]
    assert completion.text == "Checking three cities."


def test_arguments_that_are_not_json_carry_the_raw_text_and_fail_validation(
    server: FakeProvider, model: OpenAIModel
) -> None:
    server.script(openai_stream(calls=[("call_1", "get_weather", ['{"city": "Par'])]))

    [call] = model.complete(ask(tools=(WEATHER,)), lambda _text: None).calls

    assert call.args == {RAW_ARGUMENTS: '{"city": "Par'}
    error = get_weather.error_for(call.args)
    assert error is not None and RAW_ARGUMENTS in error and "city: Field required" in error


# Failures -------------------------------------------------------------------------------


@pytest.mark.parametrize("abort", [False, True], ids=["ends-early", "connection-drops"])
def test_a_cut_stream_is_retryable_and_the_retry_yields_one_clean_completion(
    server: FakeProvider, model: OpenAIModel, abort: bool
) -> None:
    full = openai_stream(["one ", "two ", "three ", "four"])
    server.script(full.cut(abort=abort))
    with pytest.raises(ModelRetryable):
        model.complete(ask(), lambda _text: None)

    server.script(full.cut(abort=abort), full)
    chunks: list[str] = []
    sleeps: list[float] = []
    completion = retry(model, ask(), chunks, sleeps)

    assert completion.text == "one two three four"
    assert len(server.requests) == 3 and len(sleeps) == 1
    assert chunks[-4:] == ["one ", "two ", "three ", "four"]  # earlier chunks were live only


def test_an_error_inside_the_stream_is_retryable(server: FakeProvider, model: OpenAIModel) -> None:
    partial = openai_stream(["one ", "two"]).events[:2]
    error = {"error": {"message": "The server is overloaded", "type": "server_error"}}
    server.script(Reply(events=[*partial, SSE(json.dumps(error))]))

    with pytest.raises(ModelRetryable, match="The server is overloaded"):
        model.complete(ask(), lambda _text: None)


@pytest.mark.parametrize(
    ("headers", "wait_s"),
    [({"retry-after": "3"}, 3.0), ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5)],
)
def test_429_honours_the_retry_after_headers(
    server: FakeProvider, model: OpenAIModel, headers: dict[str, str], wait_s: float
) -> None:
    server.script(openai_error(429, "Rate limit reached", headers))
    with pytest.raises(ModelRetryable) as caught:
        model.complete(ask(), lambda _text: None)
    assert caught.value.retry_after_s == wait_s

    server.script(openai_error(429, "Rate limit reached", headers), openai_stream(["ok"]))
    sleeps: list[float] = []
    assert retry(model, ask(), [], sleeps).text == "ok"
    assert sleeps == [wait_s]


def test_repeated_500s_are_retryable_each_time(server: FakeProvider, model: OpenAIModel) -> None:
    server.repeat(openai_error(500, "The server had an error"))
    for _ in range(3):
        with pytest.raises(ModelRetryable, match="HTTP 500"):
            model.complete(ask(), lambda _text: None)

    sleeps: list[float] = []
    with pytest.raises(ModelRetryable):
        retry(model, ask(), [], sleeps, attempts=3)
    assert len(server.requests) == 6 and len(sleeps) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_client_errors_are_fatal_and_not_retried(
    server: FakeProvider, model: OpenAIModel, status: int
) -> None:
    server.script(openai_error(status, "Invalid 'messages'"))
    with pytest.raises(ModelFatal, match=f"HTTP {status}"):
        retry(model, ask(), [], [])
    assert len(server.requests) == 1


def test_a_refused_connection_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIModel("gpt-test", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
    with pytest.raises(ModelRetryable, match="connection failed"):
        model.complete(ask(), lambda _text: None)
    model.close()


def test_a_request_slower_than_the_timeout_is_retryable(
    server: FakeProvider, model: OpenAIModel
) -> None:
    server.script(Reply(stall=True))
    with pytest.raises(ModelRetryable, match="timed out"):
        model.complete(ask(settings=ModelSettings(timeout_s=0.2)), lambda _text: None)


# The history on the wire -------------------------------------------------------------


def test_a_history_with_an_event_an_interruption_and_a_summary_is_sent_as_the_api_requires(
    server: FakeProvider, model: OpenAIModel
) -> None:
    history: list[Item] = [
        Summary(text="The user lives in Paris.", upto_seq=6),
        UserText(text="Weather in Oslo and Rome?"),
        AssistantTurn(
            calls=(
                ToolCall(call_id="call_1", name="get_weather", args={"city": "Oslo"}),
                ToolCall(call_id="call_2", name="get_weather", args={"city": "Rome"}),
            )
        ),
        ToolResult(call_id="call_1", name="get_weather", content="cold"),
        ToolResult(call_id="call_2", name="get_weather", content=INTERRUPTED),
        UserText(text="Skip Rome."),
        EventShown(
            call_id="evt_1",
            original_call_id="call_2",
            original_name="get_weather",
            original_args={"city": "Rome"},
            content="late result: rainy",
        ),
    ]
    server.script(openai_stream(["Oslo is cold."]))

    model.complete(ask(items=history, tools=(WEATHER, RESERVED)), lambda _text: None)

    body = server.bodies[0]
    messages = body["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "user",
        "assistant",
        "tool",
        "tool",
        "user",
        "assistant",
        "tool",
    ]
    assert messages[1]["content"] == SUMMARY_PREFIX + "The user lives in Paris."
    assert messages[3]["content"] is None
    assert [c["id"] for c in messages[3]["tool_calls"]] == ["call_1", "call_2"]
    assert [(m["tool_call_id"], m["content"]) for m in messages[4:6]] == [
        ("call_1", "cold"),
        ("call_2", INTERRUPTED),
    ]
    [synthetic] = messages[7]["tool_calls"]
    assert synthetic["id"] == messages[8]["tool_call_id"] == "evt_1"
    assert synthetic["function"]["name"] == EVENT_TOOL_NAME
    assert messages[8]["content"] == "late result: rainy"
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]


# Registry ------------------------------------------------------------------------------


def test_openai_model_strings_resolve_with_the_sdk_environment(
    server: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    server.script(openai_stream(["from env"]))

    model = resolve_model("openai:gpt-env-test")

    assert isinstance(model, OpenAIModel) and model.model == "gpt-env-test"
    assert model.context_window == 128_000
    assert resolve_model("openai:gpt-env-test") is model
    assert model.complete(ask(), lambda _text: None).text == "from env"
    assert server.requests[0].headers["authorization"] == "Bearer env-key"
    model.close()


# End to end through LocalSystem -----------------------------------------------------------


def test_local_system_runs_text_tool_call_result_and_final_answer(
    server: FakeProvider, model: OpenAIModel
) -> None:
    server.script(
        openai_stream(calls=[("call_w", "get_weather", ['{"city": "Paris"}'])]),
        openai_stream(["It is ", "sunny in Paris."]),
    )
    agent = Agent("weather", model=model, instructions="You are terse.", tools=[get_weather])

    with LocalSystem([agent], "memory://") as system:
        thread_id = system.launch("weather", "Weather in Paris?")
        system.run_until_idle()
        history = system.history(thread_id)

    assert history == [
        UserText(text="Weather in Paris?"),
        AssistantTurn(
            calls=(ToolCall(call_id="call_w", name="get_weather", args={"city": "Paris"}),)
        ),
        ToolResult(call_id="call_w", name="get_weather", content="sunny in Paris"),
        AssistantTurn(text="It is sunny in Paris."),
    ]
    second = server.bodies[1]["messages"]
    assert second[-2]["tool_calls"][0]["id"] == "call_w"
    assert second[-1] == {"role": "tool", "tool_call_id": "call_w", "content": "sunny in Paris"}


def test_a_failing_provider_stalls_the_thread_and_retry_completes_it(
    server: FakeProvider, model: OpenAIModel
) -> None:
    server.repeat(openai_error(500, "The server had an error"))
    agent = Agent("weather", model=model, tools=[get_weather])
    settings = Settings(
        stall_after_failures=2, model_attempts=2, model_backoff_s=0.01, failure_backoff_s=0.0
    )

    with LocalSystem([agent], "memory://", settings=settings) as system:
        thread_id = system.launch("weather", "Weather in Paris?")
        report = system.run_until_idle(raise_on_failure=False)

        assert [f.thread_id for f in report.failed] == [thread_id]
        assert "HTTP 500" in report.failed[0].error
        thread = system.thread(thread_id)
        assert thread.status is ThreadStatus.STALLED
        assert "HTTP 500" in thread.last_error
        [pending] = system.store.inbox(thread_id, InboxState.PENDING)
        assert pending.message == system.store.inbox(thread_id)[0].message
        assert system.history(thread_id) == []
        assert len(server.requests) == 4  # two slices of two attempts each

        server.repeat(None)
        server.script(openai_stream(["Sunny."]))
        system.retry(thread_id)
        system.run_until_idle()

        assert system.history(thread_id) == [
            UserText(text="Weather in Paris?"),
            AssistantTurn(text="Sunny."),
        ]
        assert system.thread(thread_id).status is ThreadStatus.IDLE
        assert system.store.inbox(thread_id, InboxState.PENDING) == []


def test_the_network_guard_refuses_and_reports_non_local_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    real_provider = OpenAIModel("gpt-test", api_key="k")
    with (
        pytest.raises(pytest.fail.Exception, match=r"api\.openai\.com:443"),
        local_network_only() as attempts,
    ):
        with pytest.raises(ModelRetryable):
            real_provider.complete(ask(), lambda _text: None)
        assert attempts == ["api.openai.com:443"]
    real_provider.close()


def test_a_self_hosted_server_needs_no_api_key(
    server: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.script(openai_stream(["local"]))
    model = OpenAIModel("qwen2.5-7b-instruct", base_url=server.base_url)

    assert model.complete(ask(), lambda _text: None).text == "local"
    assert server.requests[0].headers["authorization"] == "Bearer not-needed"
    model.close()


def test_missing_credentials_are_fatal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(ModelFatal, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-test").complete(ask(), lambda _text: None)
