"""HTTP tools: a tool that is an endpoint somewhere else.

``http_tool`` POSTs ``{"tool", "arguments", "thread_id", "call_id", "callback_url"}`` to a
URL, with the call id as ``Idempotency-Key`` (a re-dispatched call is the same request).
A deferred HTTP tool's result arrives later through the signed callback URL; otherwise the
response body is the result. Every failure becomes an "Error: ..." result, never a hang:
requests have a timeout, and 5xx answers and transport errors are retried with backoff a
bounded number of times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
from pydantic import BaseModel

from dormant.models.retry import backoff_s
from dormant.tools.base import Tool, ToolContext

__all__ = ["HttpToolError", "http_tool"]


class HttpToolError(Exception):
    """The endpoint refused the call or could not be reached; the message is the result."""


def http_tool(
    name: str,
    url: str,
    *,
    description: str,
    arguments: type[BaseModel],
    deferred: bool = True,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
    attempts: int = 3,
    backoff_base_s: float = 0.5,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Tool:
    """A tool that POSTs its calls to ``url`` (see the module docstring for the protocol)."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")

    def invoke(ctx: ToolContext, **args: Any) -> str | None:
        body = {
            "tool": name,
            "arguments": arguments.model_validate(args).model_dump(mode="json"),
            "thread_id": ctx.thread_id,
            "call_id": ctx.call_id,
            "callback_url": ctx.callback_url,
        }
        sent = {**(headers or {}), "Idempotency-Key": ctx.call_id}
        with httpx.Client(timeout=timeout_s, transport=transport) as client:
            response = _post(client, url, body, sent, attempts, backoff_base_s, sleep)
        if deferred:
            return None
        return _result(response)

    return Tool(
        name=name,
        description=description,
        arguments=arguments,
        fn=invoke,
        context_param="ctx",
        deferred=deferred,
    )


def _post(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    attempts: int,
    base_s: float,
    sleep: Callable[[float], None],
) -> httpx.Response:
    for attempt in range(1, attempts + 1):
        try:
            response = client.post(url, json=body, headers=headers)
        except httpx.TransportError as error:
            problem = f"{url} could not be reached: {type(error).__name__}: {error}"
        else:
            if response.is_success:
                return response
            detail = response.text[:300]
            problem = f"{url} answered {response.status_code}: {detail}"
            if response.status_code < 500 and response.status_code != 429:
                raise HttpToolError(problem)  # the request itself is wrong: retrying won't help
        if attempt < attempts:
            sleep(backoff_s(attempt, base_s, base_s * 16))
    raise HttpToolError(f"{problem} (after {attempts} attempts)")


def _result(response: httpx.Response) -> str:
    """The response as result text: a JSON object's ``result`` key, or the body as is."""
    if "json" in response.headers.get("content-type", ""):
        payload = response.json()
        if isinstance(payload, dict) and "result" in payload:
            value = payload["result"]
            return value if isinstance(value, str) else response.text
    return response.text
