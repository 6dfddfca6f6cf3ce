"""``ModelSettings`` request options as each provider's server receives them (local fakes)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_providers import (
    FakeProvider,
    anthropic_stream,
    no_external_network,  # noqa: F401  (autouse guard)
    openai_stream,
)

from dormant import tool
from dormant.messages import UserText
from dormant.models import AnthropicModel, ModelRequest, ModelSettings, OpenAIModel


@tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


WEATHER = get_weather.spec()


def ask(settings: ModelSettings, *, with_tools: bool = True) -> ModelRequest:
    return ModelRequest(
        thread_id="thr_test",
        instructions="",
        items=[UserText(text="Weather in Paris?")],
        tools=(WEATHER,) if with_tools else (),
        settings=settings,
    )


def openai_body(settings: ModelSettings, *, with_tools: bool = True, **model: Any) -> Any:
    with FakeProvider.openai() as server:
        server.script(openai_stream(["ok"]))
        openai = OpenAIModel("gpt-test", base_url=server.base_url, api_key="k", **model)
        try:
            openai.complete(ask(settings, with_tools=with_tools), lambda _t: None)
        finally:
            openai.close()
        [request] = server.requests
        return request.body


def anthropic_body(settings: ModelSettings, *, with_tools: bool = True) -> Any:
    with FakeProvider.anthropic() as server:
        server.script(anthropic_stream(["ok"]))
        anthropic = AnthropicModel("claude-test", base_url=server.base_url, api_key="k")
        try:
            anthropic.complete(ask(settings, with_tools=with_tools), lambda _t: None)
        finally:
            anthropic.close()
        [request] = server.requests
        return request.body


NAMED_OPENAI = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("choice", "sent"),
    [("auto", "auto"), ("none", "none"), ("required", "required"), ("get_weather", NAMED_OPENAI)],
)
def test_openai_receives_each_tool_choice(choice: str, sent: object) -> None:
    body = openai_body(ModelSettings(tool_choice=choice))
    assert body["tool_choice"] == sent
    assert body["parallel_tool_calls"] is True  # the model's own default


def test_openai_parallel_tool_calls_setting_overrides_the_models_default() -> None:
    assert openai_body(ModelSettings(parallel_tool_calls=False))["parallel_tool_calls"] is False
    body = openai_body(ModelSettings(), parallel_tool_calls=None)
    assert "parallel_tool_calls" not in body and "tool_choice" not in body


def test_openai_sends_no_tool_options_without_tools_but_always_the_extra_body() -> None:
    settings = ModelSettings(
        tool_choice="required",
        parallel_tool_calls=False,
        extra_body={"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}},
    )
    body = openai_body(settings, with_tools=False)
    assert "tool_choice" not in body and "parallel_tool_calls" not in body
    assert body["top_k"] == 20
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("choice", "parallel", "sent"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ("get_weather", None, {"type": "tool", "name": "get_weather"}),
        ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
        (None, True, {"type": "auto", "disable_parallel_tool_use": False}),
        ("none", False, {"type": "none"}),
    ],
)
def test_anthropic_receives_each_tool_choice_with_its_parallel_flag(
    choice: str | None, parallel: bool | None, sent: object
) -> None:
    body = anthropic_body(ModelSettings(tool_choice=choice, parallel_tool_calls=parallel))
    assert body["tool_choice"] == sent


def test_anthropic_sends_no_tool_choice_by_default_or_without_tools() -> None:
    assert "tool_choice" not in anthropic_body(ModelSettings())
    body = anthropic_body(ModelSettings(tool_choice="required"), with_tools=False)
    assert "tool_choice" not in body


def test_anthropic_extra_body_is_merged_with_the_temperature() -> None:
    settings = ModelSettings(
        temperature=0.2, extra_body={"thinking": {"type": "enabled", "budget_tokens": 2048}}
    )
    body = anthropic_body(settings)
    assert body["temperature"] == 0.2
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
