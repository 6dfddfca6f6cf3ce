"""``ForkMethods``: what ``BaseClient`` offers on forks, kept out of ``base_client.py``."""

from __future__ import annotations

from typing import Any

from dormant.budget import Budget
from dormant.replay.diff import ReplayDiff, Scorer, diff_threads
from dormant.replay.start import start_replay
from dormant.replay.tools import ReplayTools
from dormant.runtime.forks import OpenCalls, fork_thread
from dormant.stores.base import Priority, Store, ThreadInfo

__all__ = ["ForkMethods"]


class ForkMethods:
    """Mixed into ``BaseClient``: forking and replaying over its ``store``."""

    store: Store

    def _wake_saved(self, thread_id: str, priority: int) -> None:
        raise NotImplementedError  # ``BaseClient``'s

    def fork(
        self,
        thread_id: str,
        at_seq: int,
        *,
        open_calls: OpenCalls = "cancel",
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """A new root thread whose history is ``thread_id``'s up to item ``at_seq``, by
        reference (one thread row, whatever the source's length); returns its id.

        Afterwards the fork is an ordinary thread: ``send`` continues it. Calls open at
        ``at_seq`` get an error result (``open_calls="cancel"``) or stay pending for a
        ``deliver`` (``"keep"``). Its metadata records the source, the fork point and the
        source agent's version under ``"fork"``. Raises ``UnknownThread`` and
        ``InvalidForkPoint``."""
        return self.fork_info(thread_id, at_seq, open_calls=open_calls, metadata=metadata).id

    def fork_info(
        self,
        thread_id: str,
        at_seq: int,
        *,
        open_calls: OpenCalls = "cancel",
        metadata: dict[str, Any] | None = None,
    ) -> ThreadInfo:
        """``fork``, returning the new thread's record."""
        return fork_thread(self.store, thread_id, at_seq, open_calls=open_calls, metadata=metadata)

    def replay(
        self,
        thread_id: str,
        from_seq: int = 1,
        *,
        model: str | None = None,
        instructions: str | None = None,
        tools: ReplayTools | None = None,
        budget: Budget | None = None,
        tag: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Replay ``thread_id`` from its user message at ``from_seq``; returns the
        replay's thread id (``diff`` compares the two).

        The replay is a fork just before that message. The source's outside inputs from
        there on (user text, events, timer fires, child reports, late results) are fed in
        their recorded order, one per turn, while the model runs live with ``model`` (a
        model string, ``"openai:gpt-5-mini"``) and ``instructions`` in place of the
        agent's. Tool calls are answered from the source's record, never by running the
        tool (``ReplayTools`` says how they match and what a miss does); a spawn is served
        the source's child, and no child runs. It runs at background priority under its own
        ``budget``, in an admission flow of its own (``"replay:<tag>"``)."""
        made = start_replay(
            self.store,
            thread_id,
            from_seq,
            model=model,
            instructions=instructions,
            tools=tools,
            budget=budget,
            tag=tag,
            metadata=metadata,
        )
        self._wake_saved(made.id, Priority.BACKGROUND)
        return made.id

    def diff(self, source_id: str, replay_id: str, scorer: Scorer | None = None) -> ReplayDiff:
        """How ``replay_id`` differs from ``source_id`` past its fork point: the first
        divergence, the tool-sequence distance, calls served, missed and run live, the
        final answers, usage deltas, and ``scorer(source_answer, replay_answer)``."""
        return diff_threads(self.store, source_id, replay_id, scorer)
