"""After the faults: wait for the system to quiesce, check every promise, count violations."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.agents import CALLBACKS, SUBSCRIPTIONS
from chaos.faults import Cluster

__all__ = ["Verdict", "judge"]


@dataclass
class Verdict:
    """What the run found: lost, duplicated and stuck work (each must be 0) and the figures."""

    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    threads: int = 0
    quiesced_at: float | None = None
    faults: Counter[str] = field(default_factory=Counter)
    messages_sent: int = 0
    slices: int = 0
    tool_runs: int = 0
    quiesce_s: float | None = None
    total_s: float = 0.0
    driver_errors: list[str] = field(default_factory=list)
    worker_exits: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.stuck or self.driver_errors)

    def report(self, seed: int) -> str:
        lines = [f"seed {seed}", "faults by kind:"]
        lines += [f"  {kind:32} {n}" for kind, n in sorted(self.faults.items())]
        lines += [
            f"  {'total':32} {sum(self.faults.values())}",
            f"threads (with children)  {self.threads}",
            f"messages sent            {self.messages_sent}",
            f"slices run               {self.slices}",
            f"tool runs                {self.tool_runs}",
            f"lost                     {len(self.lost)}",
            f"duplicated               {len(self.duplicated)}",
            f"stuck                    {len(self.stuck)}",
            "time to quiesce          "
            + (f"{self.quiesce_s:.1f} s" if self.quiesce_s is not None else "never"),
            f"total time               {self.total_s:.1f} s",
        ]
        if self.worker_exits:
            lines.append(f"processes that exited on their own: {', '.join(self.worker_exits)}")
        for title, found in (
            ("LOST", self.lost),
            ("DUPLICATED", self.duplicated),
            ("STUCK", self.stuck),
            ("DRIVER ERRORS", self.driver_errors),
        ):
            lines += [f"{title}: {line}" for line in found[:20]]
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


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
    return int(cluster.stats.llen(CALLBACKS)) + int(cluster.stats.llen(SUBSCRIPTIONS))


def judge(
    env: dict[str, str],
    sent: dict[str, list[str]],
    cluster: Cluster,
    *,
    timeout_s: float,
    tick: Callable[[], None],
) -> Verdict:
    from dormant.errors import UnknownThread
    from dormant.messages import UserText
    from dormant.ops.check import check_store
    from dormant.stores.sql.store import SQLStore

    verdict = Verdict()
    store = SQLStore(env["DORMANT_DATABASE_URL"])
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            cluster.check_alive()
            tick()
            try:
                if _quiet(store) and not _to_answer(cluster):
                    verdict.quiesced_at = time.monotonic()
                    break
            except Exception:
                pass
            time.sleep(0.5)
        for problem in check_store(store):
            line = str(problem)
            if problem.rule in ("message ids", "events") or " has 2 " in line:
                verdict.duplicated.append(line)
            elif problem.rule in ("user messages",) or " has 0 results" in line:
                verdict.lost.append(line)
            else:
                verdict.stuck.append(line)
        if verdict.quiesced_at is None:
            verdict.stuck.append(f"the system did not quiesce within {timeout_s:.0f} s")
        for thread_id, message_ids in sent.items():
            try:
                stored = store.own_items(thread_id)
            except UnknownThread:
                verdict.lost.append(f"{thread_id}: never created (see the driver errors)")
                continue
            applied = [s.message_id for s in stored if isinstance(s.item, UserText)]
            if applied != message_ids:
                verdict.lost.append(f"{thread_id}: user messages {applied}, sent {message_ids}")
        verdict.threads = len(store.threads(limit=10**9))
    finally:
        store.close()
    return verdict
