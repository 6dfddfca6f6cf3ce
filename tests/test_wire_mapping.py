"""The history → wire mappings, as pure functions (no SDK, no server)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from fake_providers import no_external_network  # noqa: F401  (autouse guard)

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
from dormant.models import anthropic_wire, openai_wire
from dormant.models.base import ToolSpec
from dormant.models.wire import (
    MISSING_RESULT,
    RAW_ARGUMENTS,
    SUMMARY_PREFIX,
    Answered,
    Called,
    Said,
    flatten,
    parse_arguments,
)
from dormant.runtime.history import INTERRUPTED
from dormant.tools.base import tool

WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
RESERVED = ToolSpec(EVENT_TOOL_NAME, "never offered", {"type": "object", "properties": {}})


def call(call_id: str, city: str) -> ToolCall:
    return ToolCall(call_id=call_id, name="get_weather", args={"city": city})


def result(call_id: str, content: str, *, is_error: bool = False) -> ToolResult:
    return ToolResult(call_id=call_id, name="get_weather", content=content, is_error=is_error)


EVENT = EventShown(
    call_id="evt_1",
    original_call_id="call_2",
    original_name="get_weather",
    original_args={"city": "Rome"},
    content="late result: rainy",
)

RICH_HISTORY: list[Item] = [
    Summary(text="The user asked about Paris.", upto_seq=4),
    UserText(text="And now Paris and Rome?"),
    AssistantTurn(text="", calls=(call("call_1", "Paris"), call("call_2", "Rome"))),
    result("call_1", "sunny"),
    result("call_2", INTERRUPTED),
    UserText(text="Never mind Rome."),
    EVENT,
]
"""A summary, parallel calls (one interrupted), user text after results, a shown event."""

EVENT_ARGS = {
    "original_tool_name": "get_weather",
    "original_tool_call_id": "call_2",
    "original_args": {"city": "Rome"},
}


# parse_arguments ----------------------------------------------------------------------


def test_json_object_arguments_parse_to_a_dict() -> None:
    assert parse_arguments('{"city": "Paris", "days": 2}') == {"city": "Paris", "days": 2}


def test_empty_or_null_arguments_mean_no_arguments() -> None:
    assert parse_arguments("") == {}
    assert parse_arguments("  ") == {}
    assert parse_arguments("null") == {}


def test_invalid_or_non_object_arguments_carry_the_raw_text() -> None:
    assert parse_arguments('{"city": "Par') == {RAW_ARGUMENTS: '{"city": "Par'}
    assert parse_arguments("[1, 2]") == {RAW_ARGUMENTS: "[1, 2]"}


def test_raw_arguments_fail_a_tools_validation_with_a_readable_error() -> None:
    @tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return city

    error = get_weather.error_for(parse_arguments('{"city": "Par'))
    assert error is not None
    assert RAW_ARGUMENTS in error and "Extra inputs are not permitted" in error
    assert "city: Field required" in error


# flatten ------------------------------------------------------------------------------


def test_flatten_expands_events_and_renders_summaries_as_user_text() -> None:
    parts = flatten(RICH_HISTORY)
    assert parts == [
        Said("user", SUMMARY_PREFIX + "The user asked about Paris."),
        Said("user", "And now Paris and Rome?"),
        Called(call("call_1", "Paris")),
        Called(call("call_2", "Rome")),
        Answered("call_1", "get_weather", "sunny"),
        Answered("call_2", "get_weather", INTERRUPTED),
        Said("user", "Never mind Rome."),
        Called(ToolCall(call_id="evt_1", name=EVENT_TOOL_NAME, args=EVENT_ARGS)),
        Answered("evt_1", EVENT_TOOL_NAME, "late result: rainy"),
    ]


def test_flatten_closes_a_call_left_open_before_anything_else() -> None:
    parts = flatten(
        [UserText(text="go"), AssistantTurn(calls=(call("c1", "Oslo"),)), UserText(text="hi")]
    )
    assert parts[2:] == [
        Answered("c1", "get_weather", MISSING_RESULT, is_error=True),
        Said("user", "hi"),
    ]
    assert flatten([AssistantTurn(calls=(call("c1", "Oslo"),))])[-1] == Answered(
        "c1", "get_weather", MISSING_RESULT, is_error=True
    )


def test_flatten_turns_a_result_without_its_call_into_user_text() -> None:
    parts = flatten([UserText(text="go"), result("ghost", "boom", is_error=True)])
    assert parts[-1] == Said("user", "Tool 'get_weather' (call ghost) failed: boom")


def test_flatten_drops_blank_assistant_text_and_keeps_blank_user_text_visible() -> None:
    parts = flatten([UserText(text=" "), AssistantTurn(text="  ")])
    assert parts == [Said("user", "(empty message)")]


# OpenAI ---------------------------------------------------------------------------------


def test_openai_messages_pair_every_tool_call_id_with_its_tool_message() -> None:
    messages = openai_wire.messages("Be brief.", RICH_HISTORY)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": SUMMARY_PREFIX + "The user asked about Paris."},
        {"role": "user", "content": "And now Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": INTERRUPTED},
        {"role": "user", "content": "Never mind Rome."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "evt_1",
                    "type": "function",
                    "function": {"name": EVENT_TOOL_NAME, "arguments": json.dumps(EVENT_ARGS)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "evt_1", "content": "late result: rainy"},
    ]


def test_openai_assistant_text_and_calls_share_one_message() -> None:
    history: list[Item] = [
        UserText(text="go"),
        AssistantTurn(text="Checking.", calls=(call("c1", "Oslo"),)),
        result("c1", "cold"),
    ]
    assistant = openai_wire.messages("", history)[1]
    assert assistant["content"] == "Checking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1"]


def test_openai_failed_results_say_error_in_words() -> None:
    history: list[Item] = [UserText(text="go"), AssistantTurn(calls=(call("c1", "Oslo"),))]
    failed = openai_wire.messages("", [*history, result("c1", "timeout", is_error=True)])
    assert failed[-1]["content"] == "Error: timeout"
    already = openai_wire.messages("", [*history, result("c1", "Error: bad", is_error=True)])
    assert already[-1]["content"] == "Error: bad"


def test_openai_tools_never_offer_the_reserved_event_name() -> None:
    assert openai_wire.tools([WEATHER, RESERVED]) == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER.parameters,
                "description": "Weather for a city.",
            },
        }
    ]


def test_openai_without_instructions_sends_no_system_message() -> None:
    assert openai_wire.messages("", [UserText(text="hi")]) == [{"role": "user", "content": "hi"}]


# Anthropic ------------------------------------------------------------------------------


def test_anthropic_messages_alternate_roles_and_merge_same_role_content() -> None:
    messages = anthropic_wire.messages(RICH_HISTORY)
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": SUMMARY_PREFIX + "The user asked about Paris."},
                {"type": "text", "text": "And now Paris and Rome?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_2",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": INTERRUPTED},
                {"type": "text", "text": "Never mind Rome."},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "evt_1", "name": EVENT_TOOL_NAME, "input": EVENT_ARGS}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "evt_1", "content": "late result: rainy"}
            ],
        },
    ]
    assert_alternating(messages)


def test_anthropic_marks_failed_results_and_omits_empty_content() -> None:
    history: list[Item] = [
        UserText(text="go"),
        AssistantTurn(calls=(call("c1", "Oslo"),)),
        result("c1", "", is_error=True),
    ]
    assert anthropic_wire.messages(history)[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "is_error": True}
    ]


def test_anthropic_history_opening_with_the_assistant_gets_a_user_message_first() -> None:
    messages = anthropic_wire.messages([EVENT])
    assert messages[0] == {
        "role": "user",
        "content": [{"type": "text", "text": anthropic_wire.OPENING_TEXT}],
    }
    assert_alternating(messages)


def test_anthropic_tool_use_ids_are_made_valid_the_same_way_in_call_and_result() -> None:
    history: list[Item] = [
        UserText(text="go"),
        AssistantTurn(calls=(call("call:1/a", "Oslo"),)),
        result("call:1/a", "cold"),
    ]
    messages = anthropic_wire.messages(history)
    assert messages[1]["content"][0]["id"] == "call_1_a"
    assert messages[2]["content"][0]["tool_use_id"] == "call_1_a"


def test_anthropic_tools_use_input_schema_and_never_offer_the_reserved_name() -> None:
    assert anthropic_wire.tools([WEATHER, RESERVED]) == [
        {
            "name": "get_weather",
            "input_schema": WEATHER.parameters,
            "description": "Weather for a city.",
        }
    ]


def assert_alternating(messages: list[dict[str, Any]]) -> None:
    roles = [m["role"] for m in messages]
    assert roles[0] == "user"
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    for message in messages:
        texts = [b for b in message["content"] if b["type"] == "text"]
        assert all(b["text"].strip() for b in texts), message
