"""A local OpenAI-compatible server that rate-limits like a provider, for ``bench/burst.py``.

``POST /v1/chat/completions`` with ``stream: true`` streams a reply of ``reply_words`` words,
one SSE chunk every ``chunk_s``, then the usage chunk and ``[DONE]``, as the real API does.
Requests per minute and tokens per minute are two token buckets that refill continuously
and hold at most ``burst_s`` seconds' worth (OpenAI enforces a per-minute limit over
shorter periods, so a minute's quota cannot be spent in the first second). A request
either bucket cannot pay for is answered 429 with the exact wait: ``retry-after-ms``
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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Bucket", "RateLimitedProvider", "Served"]


@dataclass
class Bucket:
    """``per_minute`` units, refilled continuously, holding at most ``burst_s`` seconds'
    worth (never less than one request's cost, or a request could never pass)."""

    per_minute: float
    burst_s: float
    level: float = field(init=False)
    at_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.level = self.capacity(1.0)
        self.at_s = time.monotonic()

    def capacity(self, cost: float) -> float:
        return max(cost, self.per_minute * self.burst_s / 60)

    def refill(self, now_s: float, cost: float) -> None:
        rate = self.per_minute / 60
        self.level = min(self.capacity(cost), self.level + (now_s - self.at_s) * rate)
        self.at_s = now_s

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` can be paid (0: now); after ``refill``."""
        return max(0.0, (cost - self.level) / (self.per_minute / 60))

    def reset_s(self, cost: float) -> float:
        """Seconds until the bucket is full again (OpenAI's ``x-ratelimit-reset-*``)."""
        return max(0.0, (self.capacity(cost) - self.level) / (self.per_minute / 60))


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
        burst_s: float = 1.0,
        reply_words: int = 40,
        chunk_s: float = 0.02,
    ) -> None:
        self.requests = Bucket(rpm, burst_s)
        self.tokens = Bucket(tpm, burst_s)
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
            self.requests.refill(now_s, 1)
            self.tokens.refill(now_s, tokens)
            wait_s = max(self.requests.wait_s(1), self.tokens.wait_s(tokens))
            if wait_s == 0:
                self.requests.level -= 1
                self.tokens.level -= tokens
            self.served.append(Served(time.time(), 200 if wait_s == 0 else 429, tokens))
            headers = {
                "x-ratelimit-limit-requests": str(int(self.requests.per_minute)),
                "x-ratelimit-limit-tokens": str(int(self.tokens.per_minute)),
                "x-ratelimit-remaining-requests": str(max(0, math.floor(self.requests.level))),
                "x-ratelimit-remaining-tokens": str(max(0, math.floor(self.tokens.level))),
                "x-ratelimit-reset-requests": f"{self.requests.reset_s(1):.3f}s",
                "x-ratelimit-reset-tokens": f"{self.tokens.reset_s(tokens):.3f}s",
            }
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
