"""``AnthropicModel``: the Messages API over the ``anthropic`` SDK, streamed and buffered.

Text deltas reach ``on_chunk`` as they arrive; ``input_json_delta`` pieces are joined per
content block; a ``Completion`` is returned only after ``message_stop``, so a dropped
stream never becomes a partial turn.
"""

from __future__ import annotations

import json
from collections.abc import Generator, MutableMapping
from dataclasses import dataclass, field
from typing import cast

import anthropic
import httpx2
from anthropic.types import (
    InputJSONDelta,
    MessageParam,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    RawMessageStreamEvent,
    TextBlock,
    TextDelta,
    ToolChoiceParam,
    ToolParam,
    ToolUseBlock,
)

from dormant.errors import ModelError, ModelFatal, ModelRetryable
from dormant.messages import ToolCall, Usage
from dormant.models import anthropic_wire
from dormant.models.base import ChunkSink, Completion, ModelRequest
from dormant.models.provider_errors import status_error, truncated
from dormant.models.sdk import SDKModel, keep_rate_headers
from dormant.models.wire import parse_arguments
from dormant.rate_limit import RateLimit

__all__ = ["AnthropicModel"]

_STATUS_OF_ERROR_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
"""An ``event: error`` inside a 200 stream carries only a type; map it to its HTTP status."""


class AnthropicModel(SDKModel[anthropic.Anthropic, RawMessageStreamEvent]):
    """A Claude model; ``"anthropic:<model>"`` in an agent's model string.

    ``api_key`` and ``base_url`` default to the SDK's ``ANTHROPIC_API_KEY`` and
    ``ANTHROPIC_BASE_URL``. The API requires ``max_tokens``: ``ModelSettings.max_tokens``
    when set, else ``default_max_tokens``. The agent's instructions are the system prompt.
    The SDK's own retries are off: dormant retries (``complete_with_retry``).
    ``rate_limit`` (a ``RateLimit``) makes every worker ask for admission before calling it.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        context_window: int = 200_000,
        default_max_tokens: int = 4096,
        client: anthropic.Anthropic | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.model = model
        self.name = f"anthropic:{model}"
        self.context_window = context_window
        self.default_max_tokens = default_max_tokens
        self.base_url = base_url
        self._api_key = api_key
        super().__init__(client, rate_limit)

    def _new_turn(self) -> _Turn:
        return _Turn()

    def _stream(
        self, request: ModelRequest, headers: MutableMapping[str, str]
    ) -> Generator[RawMessageStreamEvent, None, None]:
        """The stream's events, with every provider failure raised as a dormant error."""
        try:
            with self._open(request) as stream:
                keep_rate_headers(stream.response.headers, headers)
                yield from stream
        except anthropic.AnthropicError as error:
            raise _dormant_error(error) from error
        except httpx2.TransportError as error:
            raise ModelRetryable(f"Anthropic stream failed: {error!r}") from error
        except json.JSONDecodeError as error:
            raise ModelRetryable(f"Anthropic stream sent malformed JSON: {error}") from error

    def _open(self, request: ModelRequest) -> anthropic.Stream[RawMessageStreamEvent]:
        settings = request.settings
        tools = anthropic_wire.tools(request.tools)
        temperature = settings.temperature
        choice = anthropic_wire.tool_choice(settings.tool_choice, settings.parallel_tool_calls)
        extra = {**({} if temperature is None else {"temperature": temperature})}
        extra.update(settings.extra_body)
        try:
            return self.client.messages.create(
                model=self.model,
                max_tokens=settings.max_tokens or self.default_max_tokens,
                messages=cast("list[MessageParam]", anthropic_wire.messages(request.items)),
                system=request.instructions or anthropic.omit,
                tools=cast("list[ToolParam]", tools) if tools else anthropic.omit,
                tool_choice=(
                    cast("ToolChoiceParam", choice) if tools and choice else anthropic.omit
                ),
                stream=True,
                timeout=settings.timeout_s,
                extra_body=extra or None,
            )
        except TypeError as error:  # how the SDK says it found no credentials
            raise ModelFatal(
                f"the Anthropic client for {self.name} is not configured: {error}"
            ) from error

    def _new_client(self) -> anthropic.Anthropic:
        try:
            return anthropic.Anthropic(api_key=self._api_key, base_url=self.base_url, max_retries=0)
        except (anthropic.AnthropicError, ValueError) as error:
            raise ModelFatal(
                f"cannot create the Anthropic client for {self.name}: {error}"
            ) from error


def _dormant_error(error: anthropic.AnthropicError) -> ModelError:
    if isinstance(error, anthropic.APIStatusError):
        status = error.status_code
        if status < 400:  # an error event inside a streamed 200 response
            status = _STATUS_OF_ERROR_TYPE.get(str(error.type), 500)
        message = error.api_message or error.message
        return status_error("Anthropic", status, message, error.response.headers)
    if isinstance(error, anthropic.APITimeoutError):
        return ModelRetryable(f"Anthropic request timed out: {error}")
    if isinstance(error, anthropic.APIConnectionError):
        return ModelRetryable(f"Anthropic connection failed: {error.__cause__ or error}")
    if isinstance(error, anthropic.APIError):
        return ModelRetryable(f"Anthropic stream reported an error: {error.message}")
    return ModelFatal(f"Anthropic client error: {error}")


@dataclass
class _ToolBlock:
    call_id: str
    name: str
    start_input: dict[str, object]
    json_parts: list[str] = field(default_factory=list)

    def call(self) -> ToolCall:
        args = parse_arguments("".join(self.json_parts)) if self.json_parts else self.start_input
        return ToolCall(call_id=self.call_id, name=self.name, args=args)


@dataclass
class _Turn:
    """One streamed message, buffered until ``message_stop`` proves it complete."""

    text: list[str] = field(default_factory=list)
    tools: dict[int, _ToolBlock] = field(default_factory=dict)
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    output_tokens: int = 0
    stopped: bool = False

    def add(self, event: RawMessageStreamEvent, on_chunk: ChunkSink) -> None:
        match event:
            case RawMessageStartEvent(message=message):
                usage = message.usage
                self.input_tokens = usage.input_tokens
                self.cache_read_tokens = usage.cache_read_input_tokens or 0
                self.cache_creation_tokens = usage.cache_creation_input_tokens or 0
                self.output_tokens = usage.output_tokens
            case RawContentBlockStartEvent(index=index, content_block=block):
                if isinstance(block, TextBlock):
                    self._text(block.text, on_chunk)
                elif isinstance(block, ToolUseBlock):
                    self.tools[index] = _ToolBlock(block.id, block.name, dict(block.input))
            case RawContentBlockDeltaEvent(index=index, delta=delta):
                if isinstance(delta, TextDelta):
                    self._text(delta.text, on_chunk)
                elif isinstance(delta, InputJSONDelta) and index in self.tools:
                    self.tools[index].json_parts.append(delta.partial_json)
            case RawMessageDeltaEvent(usage=usage):
                # message_delta counts are cumulative: the latest value wins.
                self.output_tokens = usage.output_tokens
                self.input_tokens = _latest(usage.input_tokens, self.input_tokens)
                self.cache_read_tokens = _latest(
                    usage.cache_read_input_tokens, self.cache_read_tokens
                )
                self.cache_creation_tokens = _latest(
                    usage.cache_creation_input_tokens, self.cache_creation_tokens
                )
            case RawMessageStopEvent():
                self.stopped = True

    def _text(self, text: str, on_chunk: ChunkSink) -> None:
        if text:
            self.text.append(text)
            on_chunk(text)

    def completion(self) -> Completion:
        if not self.stopped:
            raise truncated("Anthropic", "no message_stop")
        calls = tuple(self.tools[index].call() for index in sorted(self.tools))
        usage = Usage(
            input_tokens=self.input_tokens + self.cache_read_tokens + self.cache_creation_tokens,
            output_tokens=self.output_tokens,
            cached_tokens=self.cache_read_tokens,
        )
        return Completion(text="".join(self.text), calls=calls, usage=usage)


def _latest(value: int | None, previous: int) -> int:
    return previous if value is None else value
