"""``OpenAIModel``: Chat Completions over the ``openai`` SDK, streamed and buffered.

Works against OpenAI and any OpenAI-compatible server (vLLM, llama.cpp's server, ...)
through ``base_url``. Text deltas reach ``on_chunk`` as they arrive; tool-call argument
deltas are joined by their index; a ``Completion`` is returned only once the stream has
delivered its ``finish_reason``, so a dropped stream never becomes a partial turn.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator, MutableMapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar, cast

import openai
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionToolChoiceOptionParam,
    ChatCompletionToolParam,
)
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall
from openai.types.completion_usage import CompletionUsage

from dormant.errors import ModelError, ModelFatal, ModelRetryable
from dormant.messages import ToolCall, Usage
from dormant.models import openai_wire
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.models.provider_errors import status_error, truncated
from dormant.models.sdk import SDKModel, keep_rate_headers
from dormant.models.wire import parse_arguments
from dormant.rate_limit import RateLimit

__all__ = ["OpenAIModel"]

_T = TypeVar("_T")

MaxTokensParam = Literal["max_completion_tokens", "max_tokens"]

_KEYLESS_SERVER_KEY = "not-needed"
"""Sent to a self-hosted server when no key is configured; the SDK refuses to run without one."""


class OpenAIModel(SDKModel[openai.OpenAI, ChatCompletionChunk]):
    """A Chat Completions model; ``"openai:<model>"`` in an agent's model string.

        ``api_key`` and ``base_url`` default to the SDK's ``OPENAI_API_KEY`` and
        ``OPENAI_BASE_URL``. ``max_tokens_param`` names the field ``ModelSettings.max_tokens``
        is sent as: OpenAI's current ``max_completion_tokens``, or ``max_tokens`` for servers
        that only know the older name. ``parallel_tool_calls=None`` leaves the server's default;
    ``ModelSettings.parallel_tool_calls``, when set, overrides it for an agent.
        The SDK's own retries are off: dormant retries (``complete_with_retry``).
        ``rate_limit`` (a ``RateLimit``) makes every worker ask for admission before calling it.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        context_window: int = 128_000,
        parallel_tool_calls: bool | None = True,
        max_tokens_param: MaxTokensParam = "max_completion_tokens",
        client: openai.OpenAI | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.model = model
        self.name = f"openai:{model}"
        self.context_window = context_window
        self.base_url = base_url
        self.parallel_tool_calls = parallel_tool_calls
        self.max_tokens_param = max_tokens_param
        self._api_key = api_key
        super().__init__(client, rate_limit)

    def _new_turn(self) -> _Turn:
        return _Turn()

    def _stream(
        self, request: ModelRequest, headers: MutableMapping[str, str]
    ) -> Generator[ChatCompletionChunk, None, None]:
        """The stream's chunks, with every provider failure raised as a dormant error."""
        settings = request.settings
        tools = openai_wire.tools(request.tools)
        max_tokens = settings.max_tokens
        modern = self.max_tokens_param == "max_completion_tokens"
        choice = settings.tool_choice
        parallel = (
            self.parallel_tool_calls
            if settings.parallel_tool_calls is None
            else settings.parallel_tool_calls
        )
        try:
            stream = self.client.chat.completions.create(
                model=self.model,
                messages=cast(
                    "list[ChatCompletionMessageParam]",
                    openai_wire.messages(request.instructions, request.items),
                ),
                tools=cast("list[ChatCompletionToolParam]", tools) if tools else openai.omit,
                tool_choice=cast(
                    "ChatCompletionToolChoiceOptionParam",
                    _given(openai_wire.tool_choice(choice) if tools and choice else None),
                ),
                parallel_tool_calls=_given(parallel if tools else None),
                temperature=_given(settings.temperature),
                max_completion_tokens=_given(max_tokens if modern else None),
                max_tokens=_given(None if modern else max_tokens),
                stream=True,
                stream_options={"include_usage": True},
                timeout=settings.timeout_s,
                extra_body=settings.extra_body or None,
            )
            keep_rate_headers(stream.response.headers, headers)
            with stream:
                yield from stream
        except openai.OpenAIError as error:
            raise _dormant_error(error) from error
        except json.JSONDecodeError as error:
            raise ModelRetryable(f"OpenAI stream sent malformed JSON: {error}") from error

    def _new_client(self) -> openai.OpenAI:
        api_key = self._api_key
        if api_key is None and self.base_url is not None and not os.environ.get("OPENAI_API_KEY"):
            api_key = _KEYLESS_SERVER_KEY
        try:
            return openai.OpenAI(api_key=api_key, base_url=self.base_url, max_retries=0)
        except openai.OpenAIError as error:
            raise ModelFatal(f"cannot create the OpenAI client for {self.name}: {error}") from error


def _given(value: _T | None) -> _T | openai.Omit:
    """``value``, or the SDK's marker for a field left out of the request body."""
    return openai.omit if value is None else value


def _dormant_error(error: openai.OpenAIError) -> ModelError:
    if isinstance(error, openai.APIStatusError):
        return status_error("OpenAI", error.status_code, error.message, error.response.headers)
    if isinstance(error, openai.APITimeoutError):
        return ModelRetryable(f"OpenAI request timed out: {error}")
    if isinstance(error, openai.APIConnectionError):
        return ModelRetryable(f"OpenAI connection failed: {error.__cause__ or error}")
    if isinstance(error, openai.APIError):
        return ModelRetryable(f"OpenAI stream reported an error: {error.message}")
    return ModelFatal(f"OpenAI client error: {error}")


@dataclass
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def add(self, delta: ChoiceDeltaToolCall) -> None:
        # Some servers repeat the id and name on every delta: keep the first of each.
        self.call_id = self.call_id or delta.id or ""
        if delta.function is not None:
            self.name = self.name or delta.function.name or ""
            if delta.function.arguments:
                self.arguments.append(delta.function.arguments)

    def call(self) -> ToolCall:
        args = parse_arguments("".join(self.arguments))
        return ToolCall(call_id=self.call_id, name=self.name, args=args)


@dataclass
class _Turn:
    """One streamed turn, buffered until the stream proves complete."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None

    def add(self, chunk: ChatCompletionChunk, on_chunk: ChunkSink) -> None:
        if chunk.usage is not None:
            self.usage = _usage(chunk.usage)
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # only one choice is ever asked for
            delta = choice.delta
            text = (delta.content or "") + (delta.refusal or "")
            if text:
                self.text.append(text)
                on_chunk(text)
            for call_delta in delta.tool_calls or ():
                self.calls.setdefault(call_delta.index, _PartialCall()).add(call_delta)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason

    def completion(self) -> Completion:
        if self.finish_reason is None:
            raise truncated("OpenAI", "no finish_reason")
        calls = tuple(self.calls[index].call() for index in sorted(self.calls))
        return Completion(text="".join(self.text), calls=calls, usage=self.usage)


def _usage(usage: CompletionUsage) -> Usage:
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    return Usage(
        input_tokens=usage.prompt_tokens,
        output_tokens=usage.completion_tokens,
        cached_tokens=cached or 0,
    )
