"""Chaos: workers SIGKILLed at random moments while 12 threads get messages, tools run and
sleeps fire; once the survivors drain everything, the runtime's promises hold on each thread.

Each kill comes after a random pause and picks, among the workers that consume, one in the
middle of a slice or a tool if there is one within a second; a replacement starts at once.
The random choices (send gaps, kill delays, victims) come from one seed, printed; rerun
with ``CHAOS_SEED=<seed>`` to replay them (the timing of the processes still varies).
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from chaos_agents import busy_key, completions_key, plan, slice_tasks_key, tool_runs_key
from conftest import WORKER_START_S, Deployment, scaled, wait_until
from sqlalchemy import Engine, text

from dormant.client import Client
from dormant.messages import AssistantTurn, EventShown, ToolResult, UserText
from dormant.runtime.history import INTERRUPTED, WOKEN_BY_EVENT
from dormant.stores.base import InboxState, ThreadStatus
from dormant.stores.sql.store import make_engine

THREADS = 12
MESSAGES = 6
KILLS = 6
BUSY_WAIT_S = 1.0
SETTLE_S = 60.0
EXPECTED_USERS = [f"u{n}" for n in range(MESSAGES + 1)]

_QUIET = text(
    """
    SELECT
      (SELECT count(*) FROM threads WHERE id = ANY(:ids) AND status <> 'idle'),
      (SELECT count(*) FROM inbox
        WHERE thread_id = ANY(:ids) AND state IN ('pending', 'deferred')),
      (SELECT count(*) FROM outbox WHERE thread_id = ANY(:ids) AND ran_at IS NULL),
      (SELECT count(*) FROM timers WHERE thread_id = ANY(:ids) AND fired_at IS NULL)
    """
)


def _unsettled(engine: Engine, thread_ids: list[str]) -> tuple[int, int, int, int]:
    """(threads not idle, pending or deferred inbox rows, outbox rows not run, timers not
    fired): all zero means nothing is left that could change a thread."""
    with engine.connect() as conn:
        row = conn.execute(_QUIET, {"ids": thread_ids}).one()
    return (row[0], row[1], row[2], row[3])


def _expected_result(name: str, args: dict[str, object]) -> str:
    a, b = int(str(args.get("a"))), int(str(args.get("b")))
    return str(a + b) if name == "add" else str(a * b)


def _problems(client: Client, thread_id: str) -> list[str]:
    """What is wrong with one settled thread (nothing, if the runtime kept its promises)."""
    found: list[str] = []
    stored = client.stored_history(thread_id)
    items = [s.item for s in stored]
    users = [i.text for i in items if isinstance(i, UserText)]
    if users != EXPECTED_USERS:
        found.append(f"user texts {users}, expected {EXPECTED_USERS}")
    seqs = [s.seq for s in stored]
    if seqs != list(range(1, len(stored) + 1)):
        found.append(f"seqs not contiguous: {seqs}")
    ids = Counter(s.message_id for s in stored)
    if twice := sorted(m for m, k in ids.items() if k > 1):
        found.append(f"message ids stored twice: {twice}")
    made = {c.call_id: c for i in items if isinstance(i, AssistantTurn) for c in i.calls}
    results = [i for i in items if isinstance(i, ToolResult)]
    answered = Counter(r.call_id for r in results)
    for call_id in made:
        if answered[call_id] != 1:
            found.append(f"call {call_id} ({made[call_id].name}) has {answered[call_id]} results")
    if stray := sorted(set(answered) - set(made)):
        found.append(f"results for calls never made: {stray}")
    interrupted = set()
    for result in results:
        made_call = made.get(result.call_id)
        if made_call is None:
            continue
        if result.content == INTERRUPTED:
            interrupted.add(result.call_id)
            continue
        if made_call.name == "sleep":
            ok = result.content in ("Slept for 0 seconds.", WOKEN_BY_EVENT)
        else:
            ok = result.content == _expected_result(made_call.name, made_call.args)
        if not ok or result.name != made_call.name:
            found.append(f"wrong result for {made_call!r}: {result!r}")
    late = [i for i in items if isinstance(i, EventShown)]
    late_calls = Counter(e.original_call_id for e in late)
    if twice := sorted(c for c, k in late_calls.items() if k > 1):
        found.append(f"late results shown twice for calls {twice}")
    for event in late:
        made_call = made.get(event.original_call_id)
        if event.original_call_id not in interrupted or made_call is None:
            found.append(f"an event on a call that was not interrupted: {event!r}")
        elif made_call.name == "sleep" or event.content != (
            f"late result: {_expected_result(made_call.name, made_call.args)}"
        ):
            found.append(f"wrong late result for {made_call!r}: {event!r}")
    for item in items:
        if isinstance(item, AssistantTurn) and item.text.startswith("on u"):
            wanted = [name for name, _ in plan(int(item.text.removeprefix("on u")))]
            if [c.name for c in item.calls] != wanted:
                found.append(f"a turn with unexpected calls: {item!r}")
    if not items or not isinstance(items[-1], AssistantTurn):
        found.append(f"the last item is not an assistant turn: {items[-1:]}")
    rows = client.store.inbox(thread_id)
    if odd := [r for r in rows if r.state is not InboxState.DONE]:
        shown = [(r.id, r.message_id, r.state, r.reason) for r in odd]
        found.append(f"inbox rows not done: {shown}")
    if (user_rows := sum(r.message.kind == "user" for r in rows)) != len(EXPECTED_USERS):
        found.append(f"{user_rows} user rows in the inbox")
    if (status := client.thread(thread_id).status) is not ThreadStatus.IDLE:
        found.append(f"status {status}")
    return found


def _dump(client: Client, thread_id: str) -> str:
    lines = [f"=== thread {thread_id} ({client.thread(thread_id).status}) ==="]
    for s in client.stored_history(thread_id):
        lines.append(f"  {s.seq:3} {s.message_id:45} {s.item!r}")
    for r in client.store.inbox(thread_id):
        lines.append(f"  inbox {r.id} {r.message_id} {r.state} {r.reason!r} {r.message!r}")
    return "\n".join(lines)


def test_workers_killed_at_random_lose_and_duplicate_nothing(
    deploy: Callable[..., Deployment],
) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or secrets.randbits(32))
    print(f"\nchaos seed {seed} (replay with CHAOS_SEED={seed})")
    rng = random.Random(seed)
    started = time.monotonic()
    d = deploy(
        DORMANT_AGENTS="chaos_agents",
        DORMANT_SWEEP_INTERVAL_S="1",
        DORMANT_LEASE_TTL_S="3",
        DORMANT_VISIBILITY_TIMEOUT_S="6",
        DORMANT_OUTBOX_GRACE_S="2",
    )
    workers = [d.start_worker(f"w{k}", concurrency=4) for k in (1, 2)]
    d.start_beat()
    d.wait_ready(*workers)
    client = d.client()
    thread_ids = [client.launch("chaos", "u0", message_id="u0") for _ in range(THREADS)]

    stop = threading.Event()  # set only to abandon the senders after a failure
    errors: list[BaseException] = []

    def send_all(thread_id: str, gaps: list[float]) -> None:
        try:
            with Client.from_env(d.env) as sender:
                for n, gap in enumerate(gaps, start=1):
                    if stop.wait(gap):
                        return
                    sender.send(thread_id, f"u{n}", message_id=f"u{n}")
        except BaseException as error:
            errors.append(error)

    senders = [
        threading.Thread(
            target=send_all,
            args=(t, [rng.uniform(0.2, 1.8) for _ in range(MESSAGES)]),
            name=f"sender-{k}",
        )
        for k, t in enumerate(thread_ids)
    ]
    for sender in senders:
        sender.start()

    kills: list[str] = []
    pause = threading.Event()  # never set: its wait is a bounded pause between kills
    unacked = f"{d.prefix}:broker:unacked"
    try:
        for k in range(KILLS):
            pause.wait(rng.uniform(0.2, 1.5))
            # The victim is one that consumes (a worker still booting has nothing to lose).
            ready = wait_until(
                lambda: [w for w in workers if d.redis.exists(d.key("ready", w.name))],
                WORKER_START_S,
                "a worker to be ready to die",
                check=d.check_alive,
            )
            # ... preferably in the middle of a slice or a tool (waiting at most a second).
            give_up = time.monotonic() + BUSY_WAIT_S
            while True:
                busy = [w for w in ready if int(d.redis.get(busy_key(d.prefix, w.name)) or 0)]
                if busy or time.monotonic() > give_up:
                    break
                pause.wait(0.01)
            victim = rng.choice(busy or ready)
            in_flight = d.redis.hlen(unacked)
            d.expected_deaths.add(victim.name)
            victim.kill()
            assert victim.popen.returncode == -signal.SIGKILL, victim.log()
            workers.remove(victim)
            workers.append(d.start_worker(f"w{k + 3}", concurrency=4))
            at = time.monotonic() - started
            state = "busy" if busy else "idle"
            kills.append(
                f"{victim.name}@{at:.1f}s ({state}, {in_flight} tasks unacked in the broker)"
            )
    except BaseException:
        stop.set()
        raise
    finally:
        for sender in senders:
            sender.join(timeout=scaled(30))
    assert not errors, errors
    assert not any(s.is_alive() for s in senders), "a sender hung"
    chaos_done = time.monotonic()
    print(f"killed {len(kills)} workers: {', '.join(kills)}")

    d.wait_ready(*workers)  # the two survivors
    engine = make_engine(d.env["DORMANT_DATABASE_URL"])
    try:
        wait_until(
            lambda: _unsettled(engine, thread_ids) == (0, 0, 0, 0),
            SETTLE_S,
            "every thread to settle after the chaos",
            check=d.check_alive,
            poll_s=0.25,
            detail=lambda: (
                f"\nseed {seed}: (not idle, inbox, outbox, timers) = "
                f"{_unsettled(engine, thread_ids)}:\n"
                + "\n".join(
                    _dump(client, t) for t in thread_ids if _unsettled(engine, [t]) != (0, 0, 0, 0)
                )
            ),
        )
    finally:
        engine.dispose()
    settled = time.monotonic()

    broken = {t: p for t in thread_ids if (p := _problems(client, t))}
    if broken:
        report = "\n".join(f"{t}: {'; '.join(p)}\n{_dump(client, t)}" for t, p in broken.items())
        pytest.fail(f"seed {seed}: {len(broken)} threads broke their promises:\n{report}")

    slice_tasks = int(d.redis.get(slice_tasks_key(d.prefix)) or 0)
    completions = d.redis.lrange(completions_key(d.prefix), 0, -1)
    pids = Counter(line.split()[1] for line in completions)
    items = [i for t in thread_ids for i in client.history(t)]
    interrupted = sum(isinstance(i, ToolResult) and i.content == INTERRUPTED for i in items)
    late = sum(isinstance(i, EventShown) for i in items)
    turns = sum(isinstance(i, AssistantTurn) for i in items)
    runs = Counter({k: int(v) for k, v in d.redis.hgetall(tool_runs_key(d.prefix)).items()})
    print(
        f"{interrupted} calls interrupted by user text, {late} late results shown; "
        f"{sum(runs.values())} tool runs, {sum(1 for v in runs.values() if v > 1)} calls run "
        f"more than once; {len(completions) - turns} completions never committed; "
        f"kills {len(kills)}, slice tasks run {slice_tasks}, model completions "
        f"{len(completions)} on {len(pids)} worker processes; chaos "
        f"{chaos_done - started:.1f} s, settled {settled - chaos_done:.1f} s later, "
        f"total {time.monotonic() - started:.1f} s"
    )
    assert len(kills) == KILLS
