"""Terminal 3: ask the agent something, then play CI and GitHub; print what happened.

    python -m examples.distributed.client

Every step returns at once: the agent runs on the worker, and between steps it holds no
process, task or connection, only rows in PostgreSQL.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import redis

from dormant.client import Client
from dormant.errors import MessageRejected
from dormant.messages import AssistantTurn, EventShown, Item, ToolResult, UserText
from examples.distributed.agents import CI_QUEUE


def show(item: Item) -> str:
    match item:
        case UserText(text=text):
            return f"user       {text}"
        case AssistantTurn(text=text, calls=calls):
            called = ", ".join(f"{c.name}({json.dumps(c.args)})" for c in calls)
            return f"assistant  {text}" + (f"\n           -> {called}" if called else "")
        case ToolResult(name=name, content=content):
            return f"result     {name}: {content}"
        case EventShown(original_name=name, content=content):
            return f"event      {name}: {content}"
        case _:
            return f"{item.kind:10} {item}"


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}: are the worker and beat running?")
        time.sleep(0.1)


def main() -> None:
    client = Client.from_env()
    ci = redis.Redis.from_url(os.environ["DORMANT_REDIS_URL"], decode_responses=True)
    printed = 0

    def catch_up() -> None:
        nonlocal printed
        history = client.history(thread_id)
        for item in history[printed:]:
            print("  " + show(item).replace("\n", "\n  "))
        printed = len(history)

    thread_id = client.launch("triage", "Build main, and tell me when a PR comes in.")
    print(f"1. launched {thread_id}; the worker starts a build and subscribes")
    job = ci.blpop([CI_QUEUE], timeout=30)
    if job is None:
        raise SystemExit("no CI job arrived: is the worker running?")
    callback_url = json.loads(job[1])["callback_url"]
    wait_for("the subscription", lambda: len(client.history(thread_id)) >= 3)
    catch_up()
    print(f"   thread is {client.thread(thread_id).status}: nothing runs while it waits")

    print("2. CI calls back (a forged token is refused first)")
    try:
        client.deliver_callback(callback_url[:-4] + "AAAA", "green")
    except MessageRejected as error:
        print(f"   refused: {error}")
    client.deliver_callback(callback_url, "green, 1,204 tests passed", message_id="ci-main-1")
    wait_for("the build report", lambda: len(client.history(thread_id)) >= 5)
    catch_up()

    print("3. a pull request is opened: a temporary child thread looks at it and reports")
    watch_id = next(
        c.call_id
        for item in client.history(thread_id)
        if isinstance(item, AssistantTurn)
        for c in item.calls
        if c.name == "watch_pull_requests"
    )
    client.send_event(
        thread_id, watch_id, "PR #42 opened by dana: 'Retry flaky DB tests'", message_id="gh-42"
    )
    wait_for("the child's report", lambda: client.thread(thread_id).status == "idle")
    catch_up()
    print(f"   thread is {client.thread(thread_id).status}; live events kept in Redis:")
    for event in client.events(thread_id)[-3:]:
        print(f"   {event.kind}: {event.model_dump_json(exclude={'thread_id'})[:100]}")
    client.close()


if __name__ == "__main__":
    main()
