"""Names Flower shows: which agent a thread runs, which tool a call is, known at send time.

A Celery task's display name (its ``shadow``, e.g. ``dormant.slice[triage]`` or
``dormant.tool[run_build]``) is fixed when the message is sent, so the sender must know the
agent or tool then. ``TaskLabels`` is a bounded, thread-safe cache of what a process has
already read or written: ``LabelledSQLStore`` notes the agent of every thread it creates,
loads or commits, and the tool name of every call it loads or commits. No read is added for
display: a send whose thread this process has not seen (a client's ``send`` to an old
thread, the sweeper's re-dispatch after a restart) goes out under the plain task name.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TypeVar

from dormant.stores.base import CallRecord, Commit, NewThread, OutboxRow, Snapshot, ThreadInfo
from dormant.stores.sql.items import ITEM_CACHE_BYTES
from dormant.stores.sql.store import SQLStore

__all__ = ["LabelledSQLStore", "TaskLabels"]

_K = TypeVar("_K")


class TaskLabels:
    """thread id -> agent name and (thread id, call id) -> tool name, least recently used
    entries dropped beyond ``max_entries`` each."""

    def __init__(self, max_entries: int = 10_000) -> None:
        self._max_entries = max_entries
        self._lock = threading.Lock()
        self._agents: OrderedDict[str, str] = OrderedDict()
        self._tools: OrderedDict[tuple[str, str], str] = OrderedDict()

    def note_agent(self, thread_id: str, agent: str) -> None:
        with self._lock:
            _put(self._agents, thread_id, agent, self._max_entries)

    def note_calls(self, thread_id: str, calls: Iterable[CallRecord]) -> None:
        with self._lock:
            for call in calls:
                _put(self._tools, (thread_id, call.call_id), call.name, self._max_entries)

    def agent(self, thread_id: str) -> str | None:
        with self._lock:
            return _get(self._agents, thread_id)

    def tool(self, thread_id: str, call_id: str) -> str | None:
        with self._lock:
            return _get(self._tools, (thread_id, call_id))

    def slice_name(self, task: str, thread_id: str) -> str | None:
        """``dormant.slice[triage]``, or None when the agent is not known here."""
        agent = self.agent(thread_id)
        return f"{task}[{agent}]" if agent else None

    def tool_name(self, task: str, row: OutboxRow) -> str | None:
        """``dormant.tool[run_build]`` (``[run_build:cancel]`` for a cancel hook), or None."""
        tool = self.tool(row.thread_id, row.call_id)
        if tool is None:
            return None
        return f"{task}[{tool}]" if row.action == "tool" else f"{task}[{tool}:{row.action}]"


def _get(entries: OrderedDict[_K, str], key: _K) -> str | None:
    """The entry, now the most recently used."""
    value = entries.get(key)
    if value is not None:
        entries.move_to_end(key)
    return value


def _put(entries: OrderedDict[_K, str], key: _K, value: str, max_entries: int) -> None:
    entries[key] = value
    entries.move_to_end(key)
    while len(entries) > max_entries:
        entries.popitem(last=False)


class LabelledSQLStore(SQLStore):
    """``SQLStore`` that notes agents and tool names in ``labels`` as rows pass through."""

    def __init__(
        self,
        database_url: str,
        labels: TaskLabels,
        *,
        table_prefix: str = "",
        history_cache_bytes: int = ITEM_CACHE_BYTES,
    ) -> None:
        super().__init__(
            database_url, table_prefix=table_prefix, history_cache_bytes=history_cache_bytes
        )
        self.labels = labels

    def create_thread(self, thread: NewThread) -> ThreadInfo:
        info = super().create_thread(thread)
        self.labels.note_agent(info.id, info.agent)
        return info

    def thread(self, thread_id: str) -> ThreadInfo:
        info = super().thread(thread_id)
        self.labels.note_agent(info.id, info.agent)
        return info

    def load(self, thread_id: str) -> Snapshot:
        snap = super().load(thread_id)
        self.labels.note_agent(thread_id, snap.thread.agent)
        self.labels.note_calls(thread_id, snap.calls.values())
        return snap

    def call(self, thread_id: str, call_id: str) -> CallRecord:
        record = super().call(thread_id, call_id)
        self.labels.note_calls(thread_id, [record])
        return record

    def commit(self, commit: Commit) -> list[OutboxRow] | None:
        rows = super().commit(commit)
        if rows is not None:
            self.labels.note_calls(commit.thread_id, commit.calls)
            for child in commit.threads:
                self.labels.note_agent(child.id, child.agent)
        return rows
