"""A local OpenAI-compatible server that rate-limits like a provider, for ``bench/burst.py``.

``POST /v1/chat/completions`` with ``stream: true`` streams a reply of ``reply_words`` words,
one SSE chunk every ``chunk_s``, then the usage chunk and ``[DONE]``, as the real API does.
Requests per minute and tokens per minute are two limits of one shape: ``bucket`` (the
default) refills continuously and holds at most ``burst_s`` seconds' worth (OpenAI enforces
a per-minute limit over shorter periods, so a minute's quota cannot be spent in the first
second); ``window`` allows the minute's quota in any 60 s, so a burst that spends it at
once is told to wait up to a minute (the server of issue 23). A request either limit
cannot pay for is answered 429 with the exact wait: ``retry-after-ms``
(what dormant reads first), ``retry-after`` in whole seconds rounded up, and OpenAI's
``x-ratelimit-*`` headers on every answer.

A request costs one request and its tokens: the prompt's characters / 4 plus the reply's
words, charged up front (a provider charges ``max_tokens`` up front and corrects later).
Every request is recorded (arrival time, status), and so is the first chunk streamed for
each user text (the last user message of a successful request): the driver's
send-to-first-token end.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

__all__ = ["Bucket", "Limit", "RateLimitedProvider", "Served", "Window"]


class Limit(Protocol):
    """One limit (requests or tokens a minute) as the server keeps it."""

    per_minute: float

    def wait_s(self, now_s: float, cost: float) -> float:
        """Seconds until ``cost`` can be paid (0: now)."""

    def take(self, now_s: float, cost: float) -> None: ...

    def remaining(self, now_s: float) -> float: ...

    def reset_s(self, now_s: float) -> float:
        """Seconds until the whole limit is free again (OpenAI's ``x-ratelimit-reset-*``)."""


@dataclass
class Bucket:
    """``per_minute`` units, refilled continuously, holding at most ``burst_s`` seconds'
    worth (never less than one request's cost, or a request could never pass)."""

    per_minute: float
    burst_s: float
    level: float = field(init=False)
    at_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.level = self._capacity(1.0)
        self.at_s = time.monotonic()

    def _capacity(self, cost: float) -> float:
        return max(cost, self.per_minute * self.burst_s / 60)

    def _refill(self, now_s: float, cost: float) -> None:
        rate = self.per_minute / 60
        self.level = min(self._capacity(cost), self.level + (now_s - self.at_s) * rate)
        self.at_s = now_s

    def wait_s(self, now_s: float, cost: float) -> float:
        self._refill(now_s, cost)
        return max(0.0, (cost - self.level) / (self.per_minute / 60))

    def take(self, now_s: float, cost: float) -> None:
        self.level -= cost

    def remaining(self, now_s: float) -> float:
        return self.level

    def reset_s(self, now_s: float) -> float:
        return max(0.0, (self._capacity(1.0) - self.level) / (self.per_minute / 60))


@dataclass
class Window:
    """At most ``per_minute`` units in any 60 s: a unit is free again 60 s after it was
    spent, so a burst that spends the minute's quota at once waits up to a minute."""

    per_minute: float
    spent: deque[tuple[float, float]] = field(default_factory=deque)
    """(when, cost), oldest first."""

    def _expire(self, now_s: float) -> None:
        while self.spent and self.spent[0][0] <= now_s - 60:
            self.spent.popleft()

    def wait_s(self, now_s: float, cost: float) -> float:
        self._expire(now_s)
        excess = sum(c for _, c in self.spent) + cost - max(cost, self.per_minute)
        for at_s, spent in self.spent:
            if excess <= 0:
                break
            excess -= spent
            if excess <= 0:
                return at_s + 60 - now_s
        return 0.0

    def take(self, now_s: float, cost: float) -> None:
        self.spent.append((now_s, cost))

    def remaining(self, now_s: float) -> float:
        return self.per_minute - sum(c for _, c in self.spent)

    def reset_s(self, now_s: float) -> float:
        return self.spent[-1][0] + 60 - now_s if self.spent else 0.0


@dataclass(frozen=True)
class Served:
    """One request as the server answered it."""

    at_s: float
    """``time.time()`` of its arrival."""
    status: int
    tokens: int


class RateLimitedProvider:
    """The server on 127.0.0.1 (an ephemeral port), in threads of this process."""

    def __init__(
        self,
        rpm: float,
        tpm: float,
        *,
        limiter: str = "bucket",
        burst_s: float = 1.0,
        reply_words: int = 40,
        chunk_s: float = 0.02,
    ) -> None:
        self.requests: Limit
        self.tokens: Limit
        if limiter == "bucket":
            self.requests, self.tokens = Bucket(rpm, burst_s), Bucket(tpm, burst_s)
        elif limiter == "window":
            self.requests, self.tokens = Window(rpm), Window(tpm)
        else:
            raise ValueError(f"limiter {limiter!r}: bucket or window")
        self.reply_words = reply_words
        self.chunk_s = chunk_s
        self.served: list[Served] = []
        self.first_chunk_at: dict[str, float] = {}
        """The last user message of a successful request → when its first chunk was sent."""
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.provider = self
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=lambda: self._server.serve_forever(poll_interval=0.05), daemon=True
        )
        self._thread.start()

    def admit(self, tokens: int) -> tuple[float, dict[str, str]]:
        """Take one request and ``tokens`` from the buckets, or neither: the wait in
        seconds (0 if taken) and the ``x-ratelimit-*`` headers after it."""
        now_s = time.monotonic()
        with self._lock:
            wait_s = max(self.requests.wait_s(now_s, 1), self.tokens.wait_s(now_s, tokens))
            if wait_s == 0:
                self.requests.take(now_s, 1)
                self.tokens.take(now_s, tokens)
            self.served.append(Served(time.time(), 200 if wait_s == 0 else 429, tokens))
            headers = {}
            for name, limit in (("requests", self.requests), ("tokens", self.tokens)):
                headers[f"x-ratelimit-limit-{name}"] = str(int(limit.per_minute))
                remaining = max(0, math.floor(limit.remaining(now_s)))
                headers[f"x-ratelimit-remaining-{name}"] = str(remaining)
                headers[f"x-ratelimit-reset-{name}"] = f"{limit.reset_s(now_s):.3f}s"
        return wait_s, headers

    def first_chunk(self, user_text: str) -> None:
        with self._lock:
            self.first_chunk_at.setdefault(user_text, time.time())

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a burst of connections must not be refused by the backlog
    provider: RateLimitedProvider


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.close_connection = True
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}}, {})
            return
        body = json.loads(raw)
        provider = self.server.provider
        tokens = len(json.dumps(body["messages"])) // 4 + provider.reply_words
        wait_s, headers = provider.admit(tokens)
        if wait_s > 0:
            headers["retry-after-ms"] = str(math.ceil(wait_s * 1000))
            headers["retry-after"] = str(math.ceil(wait_s))
            error = {
                "message": f"Rate limit reached: retry in {wait_s:.3f}s",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
            self._json(429, {"error": error}, headers)
            return
        self._stream(body, tokens, headers)

    def _stream(self, body: dict[str, Any], tokens: int, headers: dict[str, str]) -> None:
        provider = self.server.provider
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        user_text = _last_user_text(body["messages"])
        words = provider.reply_words
        self._send(_chunk(body, {"role": "assistant", "content": ""}))
        provider.first_chunk(user_text)
        for n in range(words):
            time.sleep(provider.chunk_s)
            self._send(_chunk(body, {"content": f"word{n} "}))
        self._send(_chunk(body, {}, finish="stop"))
        usage = {"prompt_tokens": tokens - words, "completion_tokens": words}
        usage["total_tokens"] = tokens
        self._send(json.dumps(json.loads(_chunk(body, {})) | {"choices": [], "usage": usage}))
        self._send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def _send(self, data: str) -> None:
        event = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the driver reads ``RateLimitedProvider.served``."""


def _chunk(body: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return json.dumps(
        {
            "id": "chatcmpl-burst",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body.get("model", "bench"),
            "choices": [choice],
            "usage": None,
        }
    )


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""
