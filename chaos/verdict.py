"""After the faults: wait for the system to quiesce, check every promise, count violations.

Each violation is counted once, under what it means for the work: **lost** (a message
consumed or refused without its effect, a call left without its result), **duplicated** (a
message or an event applied twice, a call answered twice), **stuck** (work that was due but
not done when the run ended: a message not applied, an outbox row not run, a thread whose
status disagrees with its calls) or **broken** (any other broken promise: order, seqs, a
result for a call never made). A message not yet applied is never lost: it is stuck if the
run ended at the quiesce deadline, and still in flight (no violation) if it arrived after
the system was seen quiet.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dormant.errors import UnknownThread
from dormant.messages import UserText
from dormant.ops.check import Problem, check_store
from dormant.stores.base import InboxState, Store

if TYPE_CHECKING:
    # chaos.agents connects Celery signal handlers when imported: only the run needs it.
    from chaos.faults import Cluster

__all__ = ["RECOVERY_BOUND_S", "Verdict", "assess", "judge"]

RECOVERY_BOUND_S = 30.0
"""Lost work must be back and done, the system quiet, this soon after the last fault ended
(issue 31): with the shipped re-send settings, a run past it fails."""


@dataclass
class Verdict:
    """What the run found: lost, duplicated, stuck and broken work (each must be 0) and the
    figures."""

    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)
    threads: int = 0
    quiesced_at: float | None = None
    faults: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)
    """Faults that found nothing to hit (a drop for which no task was published in time)."""
    dropped: list[str] = field(default_factory=list)
    """The tasks the broker dropped, as ``"<task name> <kwargs>"``."""
    messages_sent: int = 0
    slices: int = 0
    tool_runs: int = 0
    recovery_s: float | None = None
    """From the end of the last fault to quiescence; None if the system never quiesced."""
    recovery_bound_s: float = RECOVERY_BOUND_S
    total_s: float = 0.0
    driver_errors: list[str] = field(default_factory=list)
    worker_exits: list[str] = field(default_factory=list)

    @property
    def recovered_in_time(self) -> bool:
        """Quiet within the bound (a run that never quiesced is already stuck)."""
        return self.recovery_s is None or self.recovery_s <= self.recovery_bound_s

    @property
    def ok(self) -> bool:
        violations = (self.lost, self.duplicated, self.stuck, self.broken, self.driver_errors)
        return not any(violations) and self.recovered_in_time

    def report(self, seed: int) -> str:
        lines = [f"seed {seed}", "faults by kind:"]
        lines += [f"  {kind:32} {n}" for kind, n in sorted(self.faults.items())]
        tasks = Counter(task.split(" ", 1)[0] for task in self.dropped)
        lines += [
            f"  {'total':32} {sum(self.faults.values())}",
            f"faults that found nothing to hit  {sum(self.missed.values())}",
            "tasks the broker dropped " + ", ".join(f"{n} {t}" for t, n in sorted(tasks.items())),
            f"threads (with children)  {self.threads}",
            f"messages sent            {self.messages_sent}",
            f"slices run               {self.slices}",
            f"tool runs                {self.tool_runs}",
            f"lost                     {len(self.lost)}",
            f"duplicated               {len(self.duplicated)}",
            f"stuck                    {len(self.stuck)}",
            f"broken                   {len(self.broken)}",
            f"recovery time            {self._recovery()}",
            f"total time               {self.total_s:.1f} s",
        ]
        lines += [f"dropped: {task}" for task in self.dropped[:20]]
        if self.worker_exits:
            lines.append(f"processes that exited on their own: {', '.join(self.worker_exits)}")
        for title, found in (
            ("LOST", self.lost),
            ("DUPLICATED", self.duplicated),
            ("STUCK", self.stuck),
            ("BROKEN", self.broken),
            ("DRIVER ERRORS", self.driver_errors),
        ):
            lines += [f"{title}: {line}" for line in found[:20]]
        if self.recovery_s is not None and not self.recovered_in_time:
            lines.append(
                f"SLOW RECOVERY: quiet {self.recovery_s:.1f} s after the last fault ended,"
                f" over the {self.recovery_bound_s:.0f} s bound"
            )
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)

    def _recovery(self) -> str:
        """From the last fault's end to quiescence, against its bound."""
        if self.recovery_s is None:
            return "never (did not quiesce)"
        return f"{self.recovery_s:.1f} s after the last fault (bound {self.recovery_bound_s:.0f} s)"


def _quiet(store: Any) -> bool:
    """Nothing left that could change a thread: no unapplied inbox row, no outbox row to
    run, no timer to fire, every thread idle or closed."""
    from sqlalchemy import text

    engine = store._engine
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM threads WHERE status NOT IN ('idle', 'closed')),"
                " (SELECT count(*) FROM inbox WHERE state IN ('pending', 'deferred')),"
                " (SELECT count(*) FROM outbox WHERE ran_at IS NULL),"
                " (SELECT count(*) FROM timers WHERE fired_at IS NULL)"
            )
        ).one()
    return all(n == 0 for n in row)


def _to_answer(cluster: Cluster) -> int:
    """Jobs and subscriptions the driver has yet to answer."""
    from chaos.agents import CALLBACKS, SUBSCRIPTIONS

    return int(cluster.stats.llen(CALLBACKS)) + int(cluster.stats.llen(SUBSCRIPTIONS))


def judge(
    env: dict[str, str],
    sent: dict[str, list[str]],
    cluster: Cluster,
    *,
    timeout_s: float,
    tick: Callable[[], None],
) -> Verdict:
    """Wait up to ``timeout_s`` for the system to quiesce, then ``assess`` the store."""
    from dormant.stores.sql.store import SQLStore

    store = SQLStore(env["DORMANT_DATABASE_URL"])
    try:
        quiesced_at: float | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            cluster.check_alive()
            tick()
            # Before the look: a row that the look cannot see yet arrived after the end.
            ended_at = datetime.now(UTC)
            try:
                if _quiet(store) and not _to_answer(cluster):
                    quiesced_at = time.monotonic()
                    break
            except Exception:
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        verdict = assess(store, sent, ended_at=ended_at, quiesced=quiesced_at is not None)
        verdict.quiesced_at = quiesced_at
        if quiesced_at is None:
            verdict.stuck.append(f"the system did not quiesce within {timeout_s:.0f} s")
    finally:
        store.close()
    return verdict


def assess(
    store: Store, sent: dict[str, list[str]], *, ended_at: datetime, quiesced: bool
) -> Verdict:
    """The violations in ``store`` when the run ended at ``ended_at``: seen quiet there
    (``quiesced``), or at the quiesce deadline. ``sent`` holds each thread's user message
    ids, in the order they were sent."""
    verdict = Verdict()
    # Work created before the end and not done is stuck; work created after is in flight.
    for problem in check_store(store, now=ended_at):
        _classify(problem, verdict)
    for thread_id, message_ids in sent.items():
        _check_sent(store, thread_id, message_ids, verdict)
    verdict.threads = len(store.threads(limit=10**9))
    return verdict


_RESULTS = re.compile(r" has (\d+) results$")


def _classify(problem: Problem, verdict: Verdict) -> None:
    line = str(problem)
    results = _RESULTS.search(problem.detail) if problem.rule == "one result per call" else None
    if problem.rule in ("message ids", "events") or (results and int(results[1]) > 1):
        verdict.duplicated.append(line)
    elif problem.rule == "user messages" or (results and int(results[1]) == 0):
        verdict.lost.append(line)
    elif problem.rule in ("stuck", "outbox"):
        verdict.stuck.append(line)
    else:
        verdict.broken.append(line)


def _check_sent(store: Store, thread_id: str, message_ids: list[str], verdict: Verdict) -> None:
    """What ``check_store`` cannot see: a message the driver sent that never reached the
    history because it was never stored, refused or set aside. One still pending or
    deferred is ``check_store``'s (stuck, if it arrived before the end); one consumed
    without its effect too (lost)."""
    try:
        applied = {s.message_id for s in store.own_items(thread_id) if isinstance(s.item, UserText)}
    except UnknownThread:
        verdict.lost.append(f"{thread_id}: never created (see the driver errors)")
        return
    rows = {row.message_id: row for row in store.inbox(thread_id)}
    for message_id in message_ids:
        row = rows.get(message_id)
        if message_id in applied:
            continue
        if row is None:
            verdict.lost.append(f"{thread_id}: user message {message_id} sent, never stored")
        elif row.state is InboxState.REJECTED:
            verdict.lost.append(f"{thread_id}: user message {message_id} rejected: {row.reason}")
        elif row.state is InboxState.QUARANTINED:
            verdict.stuck.append(f"{thread_id}: user message {message_id} set aside: {row.reason}")
