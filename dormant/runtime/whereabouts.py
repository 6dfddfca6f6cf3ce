"""Where code this process lacks runs: a worker never answers for a name it does not have.

During a rolling deploy old and new workers share the queues, and either may take a
thread whose agent, or a call whose tool, only the other has. Failing that work (a
"not installed" error the model reads as final, a stalled thread) would report a deploy
as broken work. Instead each process that runs agents announces a ``WorkerCard`` (its
agents, their tools and versions) in the store every ``announce_interval_s``, and a
process that lacks a name asks the roster:

- a live worker (seen within three announce intervals) has it: leave the work for it
  (``Elsewhere``): the slice or tool task goes back to the queue, nothing is written;
- no live worker has it, but one had it, or the work arrived, less than
  ``name_gone_after_s`` ago: leave it too (a worker restarting, a deploy still rolling);
- otherwise the name is ``Gone``: only then is the work answered (the call gets an error
  result naming what happened) or the thread stalled with that reason.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from dormant.agents import AgentRegistry
from dormant.errors import UnknownAgent
from dormant.runtime.outcomes import Left
from dormant.stores.base import AgentCard, Snapshot, WorkerCard, WorkerRoster
from dormant.tools.builtins import BUILTINS, THREAD_TOOLS

if TYPE_CHECKING:
    from dormant.runtime.deps import SliceDeps

__all__ = [
    "Elsewhere",
    "Gone",
    "Whereabouts",
    "card_of",
    "deployed_at",
    "leave",
    "locate",
    "locate_agent",
    "newer_code",
]

log = logging.getLogger("dormant.roster")

FORGET_AFTER_S = 7 * 86400.0
"""A worker's card is dropped this long after it was last seen (the drain view's past)."""
LEAVE_FOR_S = 2.0
"""How long a left thread or tool run waits before a worker takes it again: long enough
for a worker that has the name to take it first, short against a model call."""
ROSTER_CACHE_S = 2.0
"""How long a read of the roster serves the misses that follow it (a deploy's overlap
brings many at once; one query answers them)."""


@dataclass(frozen=True)
class Elsewhere:
    """Another worker has (or may soon have) the name: leave the work for it."""

    why: str


@dataclass(frozen=True)
class Gone:
    """No live worker has had the name for ``name_gone_after_s``: answer for it now."""

    why: str


def card_of(agents: AgentRegistry, worker_id: str, host: str, started_at: datetime) -> WorkerCard:
    """What a process with ``agents`` announces: each agent under its name and each alias,
    with the names its tools answer to (the built-ins it offers included)."""
    cards: dict[str, AgentCard] = {}
    for agent in agents.values():
        builtins = {n for n in BUILTINS if agent.threads or n not in THREAD_TOOLS}
        card = AgentCard(agent.fingerprint, agent.tool_names | builtins)
        cards.update(dict.fromkeys((agent.name, *agent.aliases), card))
    return WorkerCard(worker_id, host, cards, started_at, started_at)


def locate(
    roster: list[WorkerCard],
    agent: str,
    tool: str | None,
    waiting_since: datetime,
    now: datetime,
    *,
    live_s: float,
    gone_after_s: float,
) -> Elsewhere | Gone:
    """Whether a name this process lacks (``agent``, or its ``tool``) is run elsewhere."""
    what = f"agent {agent!r}" if tool is None else f"tool {tool!r} of agent {agent!r}"

    def has(card: WorkerCard) -> bool:
        have = card.agents.get(agent)
        return have is not None and (tool is None or tool in have.tools)

    holders = [c for c in roster if has(c)]
    live = [c for c in holders if c.seen_at >= now - timedelta(seconds=live_s)]
    if live:
        return Elsewhere(f"{what} is not in this worker; worker {live[0].worker_id} has it")
    last_seen = max((c.seen_at for c in holders), default=None)
    since = waiting_since if last_seen is None else max(last_seen, waiting_since)
    gone_at = since + timedelta(seconds=gone_after_s)
    if now < gone_at:
        until = f"{gone_at:%Y-%m-%d %H:%M:%S} UTC"
        return Elsewhere(f"{what} is in no live worker; the work waits for one until {until}")
    return Gone(_gone_why(what, agent, tool, roster, now, live_s, last_seen))


def _gone_why(
    what: str,
    agent: str,
    tool: str | None,
    roster: list[WorkerCard],
    now: datetime,
    live_s: float,
    last_seen: datetime | None,
) -> str:
    seen = "never announced" if last_seen is None else f"last seen {last_seen:%Y-%m-%d %H:%M} UTC"
    if tool is not None:
        versions = sorted(
            {
                c.agents[agent].version
                for c in roster
                if agent in c.agents and c.seen_at >= now - timedelta(seconds=live_s)
            }
        )
        if versions:
            return (
                f"{what} was removed in version {', '.join(versions)} "
                f"of agent {agent!r} ({seen} on a worker)"
            )
    return f"{what} is not deployed on any live worker ({seen})"


class Whereabouts:
    """This process's card in the roster, renewed on time, and the roster's answers."""

    def __init__(
        self,
        store: WorkerRoster,
        agents: AgentRegistry,
        *,
        announce_interval_s: float,
        gone_after_s: float,
    ) -> None:
        self._store = store
        self.interval_s = announce_interval_s
        self.gone_after_s = gone_after_s
        now = datetime.now(UTC)
        host = socket.gethostname()
        worker_id = f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.card = card_of(agents, worker_id, host, now)
        self._lock = threading.Lock()
        self._announced_at: datetime | None = None
        self._roster: tuple[datetime, list[WorkerCard]] | None = None
        self._superseding: tuple[datetime, dict[str, Elsewhere]] | None = None
        self._withdrawn = threading.Event()

    @property
    def live_s(self) -> float:
        """A card not renewed for three intervals is a dead worker's."""
        return 3 * self.interval_s

    def announce(self, now: datetime | None = None) -> None:
        """Renew this process's card (the roster then drops the long-dead workers')."""
        now = now or datetime.now(UTC)
        card = WorkerCard(
            self.card.worker_id, self.card.host, self.card.agents, self.card.started_at, now
        )
        forget_s = max(FORGET_AFTER_S, 2 * self.gone_after_s)
        self._store.announce(card, now - timedelta(seconds=forget_s))
        with self._lock:
            self._announced_at = now
            self._roster = None

    def keep_announcing(self) -> None:
        """Announce now, then every interval from a daemon thread, for the process's life
        (a Celery worker's). A store that is down is logged and tried at the next turn."""

        def loop() -> None:
            while not self._withdrawn.is_set():
                try:
                    self.announce()
                except Exception as error:
                    log.warning("could not renew this worker's card in the roster (%s)", error)
                self._withdrawn.wait(self.interval_s)

        threading.Thread(target=loop, name="dormant-roster", daemon=True).start()

    def withdraw(self) -> None:
        """Mark this process's card dead at once (a clean shutdown), keeping when it was
        last seen: nobody waits three intervals for a worker that stopped. The renewals of
        ``keep_announcing`` stop with it."""
        self._withdrawn.set()
        now = datetime.now(UTC)
        self.announce(now - timedelta(seconds=self.live_s))

    def announce_if_due(self, now: datetime | None = None) -> None:
        now = now or datetime.now(UTC)
        with self._lock:
            last = self._announced_at
        if last is None or now - last >= timedelta(seconds=self.interval_s):
            self.announce(now)

    def locate(
        self, agent: str, tool: str | None, waiting_since: datetime, now: datetime | None = None
    ) -> Elsewhere | Gone:
        now = now or datetime.now(UTC)
        return locate(
            self._read(now),
            agent,
            tool,
            waiting_since,
            now,
            live_s=self.live_s,
            gone_after_s=self.gone_after_s,
        )

    def superseded(self, agent: str, now: datetime | None = None) -> Elsewhere | None:
        """``Elsewhere`` when a live worker runs ``agent`` at a version deployed after this
        worker's: once new code is up, the old runs nothing of that agent (no slice, no
        tool run), so every turn after a deploy's first worker starts is the new code's,
        and a thread's turns never alternate between the two. A version's deploy is the
        first start of a worker that announced it (``deployed_at``)."""
        now = now or datetime.now(UTC)
        with self._lock:
            cached = self._superseding
        if cached is None or now - cached[0] >= timedelta(seconds=ROSTER_CACHE_S):
            cached = (now, self._newer_versions(self._read(now), now))
            with self._lock:
                self._superseding = cached
        return cached[1].get(agent)

    def _newer_versions(self, roster: list[WorkerCard], now: datetime) -> dict[str, Elsewhere]:
        """Each of this worker's agents (by name and alias) that a live worker runs at a
        version deployed after this worker's (``deployed_at``)."""
        live_since = now - timedelta(seconds=self.live_s)
        deployed = deployed_at(roster)
        found: dict[str, Elsewhere] = {}
        for card in roster:
            if card.seen_at < live_since:
                continue
            for name, theirs in card.agents.items():
                mine = self.card.agents.get(name)
                if mine is None or theirs.version == mine.version or name in found:
                    continue
                since = deployed.get((name, mine.version), self.card.started_at)
                if deployed[name, theirs.version] > since:
                    found[name] = Elsewhere(
                        f"agent {name!r} version {theirs.version} was deployed after this"
                        f" worker's {mine.version}; worker {card.worker_id} has it"
                    )
        return found

    def _read(self, now: datetime) -> list[WorkerCard]:
        with self._lock:
            cached = self._roster
        if cached is not None and now - cached[0] < timedelta(seconds=ROSTER_CACHE_S):
            return cached[1]
        roster = self._store.roster()
        with self._lock:
            self._roster = (now, roster)
        return roster


def deployed_at(roster: list[WorkerCard]) -> dict[tuple[str, str], datetime]:
    """When each (agent, version) was deployed: the earliest start of a worker in the
    roster (live or not: it remembers ``FORGET_AFTER_S``) that announced it. A worker of
    the old version restarted mid-roll does not make its version the newer one."""
    first: dict[tuple[str, str], datetime] = {}
    for card in roster:
        for name, have in card.agents.items():
            key = (name, have.version)
            if key not in first or card.started_at < first[key]:
                first[key] = card.started_at
    return first


def locate_agent(deps: SliceDeps, snap: Snapshot, missing: UnknownAgent) -> Elsewhere | Gone:
    """Where the agent of the thread in ``snap`` runs, since this process lacks it; the
    wait for it is counted from the oldest message the thread has not applied."""
    if deps.whereabouts is None:  # no roster (a test's bare deps): this process is all
        return Gone(f"{missing} in this worker")
    waiting_since = min((row.created_at for row in snap.inbox), default=snap.thread.updated_at)
    return deps.whereabouts.locate(snap.thread.agent, None, waiting_since, deps.clock())


def newer_code(deps: SliceDeps, snap: Snapshot) -> Elsewhere | None:
    """Whether a live worker deployed after this one runs the thread's agent at another
    version (``Whereabouts.superseded``): then the slice is left to it. One dict lookup a
    slice; the roster behind it is read at most every ``ROSTER_CACHE_S``."""
    if deps.whereabouts is None:
        return None
    return deps.whereabouts.superseded(snap.thread.agent, deps.clock())


def leave(deps: SliceDeps, thread_id: str, why: str, seen: int) -> Left:
    """End the slice without writing anything but the thread's "not before" (and ``seen``,
    the newest inbox row it looked at: ``Store.defer``): the sweeper leaves it for
    ``LEAVE_FOR_S`` unless user text comes after, and a Celery worker sends the slice back
    to the queue."""
    not_before = deps.clock() + timedelta(seconds=LEAVE_FOR_S)
    deps.store.defer(thread_id, not_before, seen=seen)
    return Left(thread_id, why, not_before)
