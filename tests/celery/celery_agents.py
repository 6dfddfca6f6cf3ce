"""Agents the Celery tests run on real workers (``DORMANT_AGENTS=celery_agents``).

Their models are scripted functions of the history, so no API key is needed; the ones that
need to talk to the test (slice intervals, callback URLs) use Redis under the run's prefix.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import redis
from celery.signals import worker_ready

from dormant import Agent, Budget, ToolContext, tool
from dormant.demo import triage_script
from dormant.errors import ModelError, ModelFatal, ModelRetryable
from dormant.messages import Item, ToolResult, Usage, UserText
from dormant.models import Completion, ModelRequest, ScriptedModel, call, reply
from dormant.models.base import ChunkSink

__all__ = ["AGENTS", "PidRecorded", "shared_key", "worker_redis"]


@cache
def worker_redis() -> redis.Redis:
    """The test run's Redis, as seen from inside a worker process."""
    return redis.Redis.from_url(os.environ["DORMANT_TEST_REDIS_URL"], decode_responses=True)


_redis = worker_redis


def shared_key(prefix: str, *parts: str) -> str:
    """A key the tests and these agents share, under the run's prefix."""
    return ":".join((prefix, "test", *parts))


def _key(*parts: str) -> str:
    return shared_key(os.environ["DORMANT_KEY_PREFIX"], *parts)


@dataclass
class PidRecorded:
    """A scripted model that appends ``"<thread_id> <pid>"`` to the Redis list ``key`` on
    every completion, so tests see which worker process ran which thread."""

    inner: ScriptedModel
    key: str
    name: str = "pid-recorded"
    context_window: int = 128_000

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        completion = self.inner.complete(request, on_chunk)
        self.inner.requests.clear()  # keep a long-lived worker's memory flat
        prefix = os.environ["DORMANT_KEY_PREFIX"]
        worker_redis().rpush(shared_key(prefix, self.key), f"{request.thread_id} {os.getpid()}")
        return completion


@dataclass
class _Recorded:
    """A scripted model that records each completion's [start, end] per thread in Redis and
    takes a little time, so overlapping slices of one thread would show."""

    inner: ScriptedModel
    delay_s: float = 0.005
    name: str = "recorded"
    context_window: int = 128_000

    silent_s: float = 0.0
    """Said nothing for this long first (announced under ``thinking``): a reasoning model."""

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        start = time.time()
        if self.silent_s:
            _redis().rpush(_key("thinking", request.thread_id), f"{start:.6f}")
            time.sleep(self.silent_s)
        time.sleep(random.uniform(0, self.delay_s))
        completion = self.inner.complete(request, on_chunk)
        end = time.time()
        _redis().rpush(_key("intervals", request.thread_id), f"{start:.6f} {end:.6f} {os.getpid()}")
        return completion


def _last(history: Sequence[Item]) -> Item:
    return history[-1]


def _echo(history: Sequence[Item]) -> Completion:
    users = [i.text for i in history if isinstance(i, UserText)]
    return reply(f"seen {len(users)}")


def _calc(history: Sequence[Item]) -> Completion:
    last = _last(history)
    if isinstance(last, ToolResult):
        return reply(f"done: {last.content}")
    return reply("adding", call("add", a=2, b=3))


def _napper(history: Sequence[Item]) -> Completion:
    last = _last(history)
    if isinstance(last, ToolResult):
        return reply("awake")
    return reply("napping", call("sleep", seconds=float(os.environ.get("TEST_NAP_S", "8"))))


@dataclass
class _Flaky:
    """Fails the first ``failures`` completions of each thread (all of them if negative):
    with ``ModelRetryable`` (an outage) or ``ModelFatal`` (the provider refusing the
    deployment's key, which stalls the thread at once)."""

    failures: int
    error: type[ModelError] = ModelRetryable
    name: str = "flaky"
    context_window: int = 128_000

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        calls = _redis().incr(_key("calls", request.thread_id))
        if self.failures < 0 or calls <= self.failures:
            raise self.error(f"provider refused call {calls} for {request.thread_id}")
        return reply(f"answered on call {calls}")


@dataclass
class _Buggy:
    """A provider adapter with a bug: every completion raises a plain ``KeyError``."""

    name: str = "buggy"
    context_window: int = 128_000

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        _redis().incr(_key("calls", request.thread_id))
        return {}["choices"]  # type: ignore[no-any-return]


def _picky(history: Sequence[Item]) -> Completion:
    """Fails (a bug meeting odd input) on any history with "poison" in its user text."""
    texts = [i.text for i in history if isinstance(i, UserText)]
    if any("poison" in text for text in texts):
        raise KeyError("choices")
    return reply(f"read: {texts[-1]}")


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(deferred=True)
def run_build(target: str, ctx: ToolContext) -> None:
    """Start a CI build; its result arrives through the callback URL."""
    _redis().rpush(_key("callbacks"), ctx.callback_url)


@tool(subscription=True)
def watch_pull_requests(repo: str) -> str:
    """Subscribe to pull requests opened on ``repo``."""
    return f"Watching {repo} for new pull requests."


@tool
def dump_table(table: str) -> str:
    """Every row of a table: 300 KB, over ``max_message_bytes`` (256 KiB)."""
    _redis().incr(_key("runs", "dump_table"))
    return "r" * 300_000


def _dump(history: Sequence[Item]) -> Completion:
    if isinstance(_last(history), ToolResult):
        return reply("done")
    return reply("dumping", call("dump_table", table="orders"))


@tool
def tally(item: str) -> str:
    """Counts its runs: a tool whose every run the test can see."""
    _redis().incr(_key("runs", "tally"))
    return f"counted {item}"


def _tally(history: Sequence[Item]) -> Completion:
    if isinstance(_last(history), ToolResult):
        return reply("counted")
    return reply("counting", call("tally", item="stock"))


@tool
def explode(reason: str) -> str:
    """A tool that always raises."""
    raise RuntimeError(reason)


def _toolbox(history: Sequence[Item]) -> Completion:
    """Starts a build (deferred: its result never comes here) and a tool that raises."""
    if isinstance(_last(history), UserText):
        return reply("", call("run_build", target="main"), call("explode", reason="disk full"))
    return reply("noted")


@dataclass
class _Closable:
    """A root that starts a deferred build, a subscription, a sleep and a child; a child
    that streams a long reply slowly, recording in Redis that it started and what stopped
    it (``stopped:<thread>``), so a test can close the tree mid-slice."""

    name: str = "closable"
    context_window: int = 128_000

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        last = _last(request.items)
        if isinstance(last, UserText) and last.text == "start":
            return reply(
                "starting",
                call("run_build", target="main"),
                call("watch_pull_requests", repo="acme/app"),
                call("sleep", seconds=3600),
                call("spawn_thread", instructions="write a long essay"),
            )
        if not (isinstance(last, ToolResult) and last.content.startswith("You are now inside")):
            return reply("noted")
        _redis().set(_key("streaming", request.thread_id), "1")
        try:
            for _ in range(600):  # 30 s unless stopped
                time.sleep(0.05)
                on_chunk("word ")
        except BaseException as error:
            _redis().set(_key("stopped", request.thread_id), type(error).__name__)
            raise
        return reply("word " * 600)


@dataclass
class _Streamer:
    """Answers ``"answer <n>: w0 w1 ..."`` word by word, 25 ms apart (about 2 s an answer):
    long enough for the stream tests to kill a worker or flush Redis half-way."""

    name: str = "streamer"
    context_window: int = 128_000

    def complete(self, request: ModelRequest, on_chunk: ChunkSink) -> Completion:
        turn = sum(1 for item in request.items if isinstance(item, UserText))
        words = [f"answer {turn}:"] + [f" w{i}" for i in range(80)]
        for word in words:
            on_chunk(word)
            time.sleep(0.025)
        return Completion(text="".join(words))


echo = Agent("echo", model=_Recorded(ScriptedModel(_echo)))
streamer = Agent("streamer", model=_Streamer())
forgetful = Agent("forgetful", model=ScriptedModel(_echo), close_after_idle_s=2.0)
calc = Agent("calc", model=_Recorded(ScriptedModel(_calc), delay_s=0.05), tools=[add])
slow_calc = Agent("slow_calc", model=_Recorded(ScriptedModel(_calc), delay_s=0.3), tools=[add])
napper = Agent("napper", model=ScriptedModel(_napper))
thinker = Agent("thinker", model=_Recorded(ScriptedModel(_echo), silent_s=3.0))
triage = Agent(
    "triage",
    model=ScriptedModel(triage_script),  # dormant demo's script: the same story, on Celery
    tools=[run_build, watch_pull_requests],
)

flaky = Agent("flaky", model=_Flaky(failures=1))
broken = Agent("broken", model=_Flaky(failures=-1, error=ModelFatal))
buggy = Agent("buggy", model=_Buggy())

picky = Agent("picky", model=ScriptedModel(_picky))
dumper = Agent("dumper", model=ScriptedModel(_dump), tools=[dump_table])
tallier = Agent("tallier", model=ScriptedModel(_tally), tools=[tally])
toolbox = Agent("toolbox", model=ScriptedModel(_toolbox), tools=[run_build, explode])
closable = Agent(
    "closable", model=_Closable(), tools=[run_build, watch_pull_requests], threads=True
)


def _looping(history: Sequence[Item]) -> Completion:
    """Calls ``add`` on every turn, whatever it is shown: only its budget stops it."""
    return Completion(
        text="again",
        calls=(call("add", a=1, b=2),),
        usage=Usage(input_tokens=100, output_tokens=10),
    )


looper = Agent(
    "looper",
    model=ScriptedModel(_looping, name="gpt-4.1-mini"),
    tools=[add],
    budget=Budget(max_completions_per_message=None, max_tokens=330),
)

AGENTS = [
    looper,
    echo,
    forgetful,
    calc,
    slow_calc,
    napper,
    thinker,
    triage,
    flaky,
    broken,
    buggy,
    picky,
    dumper,
    tallier,
    toolbox,
    closable,
    streamer,
]


@worker_ready.connect
def _announce(**_: object) -> None:
    """Tell the test this worker consumes (its id comes from the test's environment)."""
    _redis().set(_key("ready", os.environ["TEST_WORKER_ID"]), os.getpid())
