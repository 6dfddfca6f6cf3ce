"""``AnthropicModel`` through the real ``anthropic`` SDK against a local Messages server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_providers import (
    SSE,
    FakeProvider,
    Reply,
    anthropic_error,
    anthropic_stream,
    no_external_network,  # noqa: F401  (autouse guard)
)

from dormant import Agent, LocalSystem, tool
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
from dormant.models import AnthropicModel, Completion, ModelRequest, ModelSettings, ToolSpec
from dormant.models.registry import resolve_model
from dormant.models.retry import complete_with_retry
from dormant.models.wire import RAW_ARGUMENTS, SUMMARY_PREFIX
from dormant.runtime.history import INTERRUPTED


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


WEATHER = get_weather.spec()
RESERVED = ToolSpec(EVENT_TOOL_NAME, "must never be offered", {"type": "object", "properties": {}})


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider.anthropic() as fake:
        yield fake


@pytest.fixture
def model(server: FakeProvider) -> Iterator[AnthropicModel]:
    model = AnthropicModel("claude-test", base_url=server.base_url, api_key="test-key")
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
    model: AnthropicModel,
    request: ModelRequest,
    chunks: list[str],
    sleeps: list[float],
    attempts: int = 3,
) -> Completion:
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


def test_a_text_reply_streams_its_chunks_and_parses_usage_with_cache_tokens(
    server: FakeProvider, model: AnthropicModel
) -> None:
    server.script(anthropic_stream(["It is ", "sunny ", "in Paris."], usage=(30, 9, 100, 20)))
    chunks: list[str] = []

    completion = model.complete(ask(), chunks.append)

    assert chunks == ["It is ", "sunny ", "in Paris."]
    assert completion.text == "It is sunny in Paris."
    assert completion.calls == ()
    assert completion.usage.input_tokens == 30 + 100 + 20  # uncached + cache read + cache write
    assert completion.usage.cached_tokens == 100
    assert completion.usage.output_tokens == 9
    [request] = server.requests
    assert request.body == {
        "model": "claude-test",
        "max_tokens": 4096,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
        "stream": True,
    }


def test_model_settings_are_applied_to_each_request(
    server: FakeProvider, model: AnthropicModel
) -> None:
    server.script(anthropic_stream(["ok"]))

    model.complete(
        ask(settings=ModelSettings(temperature=0.3, max_tokens=512, timeout_s=7.5)), lambda _t: None
    )

    [request] = server.requests
    assert request.body["temperature"] == 0.3
    assert request.body["max_tokens"] == 512
    assert request.headers["x-stainless-read-timeout"] == "7.5"


def test_a_tool_call_is_returned_with_its_input_json_joined(
    server: FakeProvider, model: AnthropicModel
) -> None:
    server.script(
        anthropic_stream(
            ["Let me check."], [("toolu_1", "get_weather", ['{"ci', 'ty": "Par', 'is"}'])]
        )
    )

    completion = model.complete(ask(tools=(WEATHER, RESERVED)), lambda _text: None)

    assert completion.text == "Let me check."
    assert completion.calls == (
        ToolCall(call_id="toolu_1", name="get_weather", args={"city": "Paris"}),
    )
    assert server.bodies[0]["tools"] == [
        {
            "name": "get_weather",
            "input_schema": WEATHER.parameters,
            "description": "Weather for a city.",
        }
    ]


def test_parallel_tool_calls_are_all_returned_in_order(
    server: FakeProvider, model: AnthropicModel
) -> None:
    calls = [
        ("toolu_a", "get_weather", ['{"city":', ' "Oslo"}']),
        ("toolu_b", "get_weather", ['{"city":', ' "Rome"}']),
        ("toolu_c", "get_weather", ['{"city":', ' "Lima"}']),
    ]
    server.script(anthropic_stream(calls=calls))

    completion = model.complete(ask(tools=(WEATHER,)), lambda _text: None)

    assert [(c.call_id, c.args["city"]) for c in completion.calls] == [
        ("toolu_a", "Oslo"),
        ("toolu_b", "Rome"),
        ("toolu_c", "Lima"),
    ]


def test_arguments_that_are_not_json_carry_the_raw_text_and_fail_validation(
    server: FakeProvider, model: AnthropicModel
) -> None:
    server.script(anthropic_stream(calls=[("toolu_1", "get_weather", ['{"city": "Par'])]))

    [call] = model.complete(ask(tools=(WEATHER,)), lambda _text: None).calls

    assert call.args == {RAW_ARGUMENTS: '{"city": "Par'}
    error = get_weather.error_for(call.args)
    assert error is not None and RAW_ARGUMENTS in error and "city: Field required" in error


# Failures -------------------------------------------------------------------------------


@pytest.mark.parametrize("abort", [False, True], ids=["ends-early", "connection-drops"])
def test_a_cut_stream_is_retryable_and_the_retry_yields_one_clean_completion(
    server: FakeProvider, model: AnthropicModel, abort: bool
) -> None:
    full = anthropic_stream(["one ", "two ", "three ", "four"])
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


def test_an_error_event_inside_the_stream_is_retryable(
    server: FakeProvider, model: AnthropicModel
) -> None:
    partial = anthropic_stream(["one ", "two"]).events[:4]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.script(Reply(events=[*partial, SSE(json.dumps(error), event="error")]))

    with pytest.raises(ModelRetryable, match="HTTP 529: Overloaded"):
        model.complete(ask(), lambda _text: None)


@pytest.mark.parametrize(
    ("headers", "wait_s"),
    [({"retry-after": "3"}, 3.0), ({"retry-after-ms": "1500", "retry-after": "9"}, 1.5)],
)
def test_429_honours_the_retry_after_headers(
    server: FakeProvider, model: AnthropicModel, headers: dict[str, str], wait_s: float
) -> None:
    server.script(anthropic_error(429, "rate_limit_error", "Rate limited", headers))
    with pytest.raises(ModelRetryable) as caught:
        model.complete(ask(), lambda _text: None)
    assert caught.value.retry_after_s == wait_s

    server.script(
        anthropic_error(429, "rate_limit_error", "Rate limited", headers), anthropic_stream(["ok"])
    )
    sleeps: list[float] = []
    assert retry(model, ask(), [], sleeps).text == "ok"
    assert sleeps == [wait_s]


@pytest.mark.parametrize(("status", "kind"), [(500, "api_error"), (529, "overloaded_error")])
def test_repeated_server_errors_are_retryable_each_time(
    server: FakeProvider, model: AnthropicModel, status: int, kind: str
) -> None:
    server.repeat(anthropic_error(status, kind, "try later"))
    for _ in range(3):
        with pytest.raises(ModelRetryable, match=f"HTTP {status}"):
            model.complete(ask(), lambda _text: None)

    sleeps: list[float] = []
    with pytest.raises(ModelRetryable):
        retry(model, ask(), [], sleeps, attempts=3)
    assert len(server.requests) == 6 and len(sleeps) == 2


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
    ],
)
def test_client_errors_are_fatal_and_not_retried(
    server: FakeProvider, model: AnthropicModel, status: int, kind: str
) -> None:
    server.script(anthropic_error(status, kind, "messages: roles must alternate"))
    with pytest.raises(ModelFatal, match=f"HTTP {status}: messages: roles must alternate"):
        retry(model, ask(), [], [])
    assert len(server.requests) == 1


def test_a_request_slower_than_the_timeout_is_retryable(
    server: FakeProvider, model: AnthropicModel
) -> None:
    server.script(Reply(stall=True))
    with pytest.raises(ModelRetryable, match="timed out"):
        model.complete(ask(settings=ModelSettings(timeout_s=0.2)), lambda _text: None)


# The history on the wire -------------------------------------------------------------


def test_a_history_with_an_event_an_interruption_and_a_summary_is_sent_as_the_api_requires(
    server: FakeProvider, model: AnthropicModel
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
    server.script(anthropic_stream(["Oslo is cold."]))

    model.complete(ask(items=history, tools=(WEATHER, RESERVED)), lambda _text: None)

    body = server.bodies[0]
    messages = body["messages"]
    assert body["system"] == "You are terse."
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == [
        {"type": "text", "text": SUMMARY_PREFIX + "The user lives in Paris."},
        {"type": "text", "text": "Weather in Oslo and Rome?"},
    ]
    assert [b["type"] for b in messages[1]["content"]] == [
        "tool_use",
        "tool_use",
    ]  # no empty text block
    assert [b["id"] for b in messages[1]["content"]] == ["call_1", "call_2"]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": "cold"},
        {"type": "tool_result", "tool_use_id": "call_2", "content": INTERRUPTED},
        {"type": "text", "text": "Skip Rome."},
    ]
    [synthetic] = messages[3]["content"]
    assert synthetic == {
        "type": "tool_use",
        "id": "evt_1",
        "name": EVENT_TOOL_NAME,
        "input": {
            "original_tool_name": "get_weather",
            "original_tool_call_id": "call_2",
            "original_args": {"city": "Rome"},
        },
    }
    assert messages[4]["content"] == [
        {"type": "tool_result", "tool_use_id": "evt_1", "content": "late result: rainy"}
    ]
    assert [t["name"] for t in body["tools"]] == ["get_weather"]


# Registry and end to end ------------------------------------------------------------------


def test_anthropic_model_strings_resolve_with_the_sdk_environment(
    server: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    server.script(anthropic_stream(["from env"]))

    model = resolve_model("anthropic:claude-env-test")

    assert isinstance(model, AnthropicModel) and model.model == "claude-env-test"
    assert model.context_window == 200_000
    assert model.complete(ask(), lambda _text: None).text == "from env"
    assert server.bodies[0]["model"] == "claude-env-test"
    model.close()


def test_local_system_runs_text_tool_call_result_and_final_answer(
    server: FakeProvider, model: AnthropicModel
) -> None:
    server.script(
        anthropic_stream(calls=[("toolu_w", "get_weather", ['{"city": "Paris"}'])]),
        anthropic_stream(["Sunny in Paris."]),
    )
    agent = Agent("weather", model=model, instructions="You are terse.", tools=[get_weather])

    with LocalSystem([agent], "memory://") as system:
        thread_id = system.launch("weather", "Weather in Paris?")
        system.run_until_idle()
        history = system.history(thread_id)

    assert history[1:] == [
        AssistantTurn(
            calls=(ToolCall(call_id="toolu_w", name="get_weather", args={"city": "Paris"}),)
        ),
        ToolResult(call_id="toolu_w", name="get_weather", content="sunny in Paris"),
        AssistantTurn(text="Sunny in Paris."),
    ]
    assert server.bodies[1]["messages"][-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_w", "content": "sunny in Paris"}],
    }


def test_missing_credentials_are_fatal(
    server: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_PROFILE",
        "ANTHROPIC_CONFIG_DIR",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no profile on disk either
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    model = AnthropicModel("claude-test", base_url=server.base_url)

    with pytest.raises(ModelFatal, match="not configured"):
        model.complete(ask(), lambda _text: None)
    assert server.requests == []
