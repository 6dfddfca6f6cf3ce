"""The SQL store's decoded-items cache serves a snapshot only what that snapshot holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from dormant.messages import ItemAdapter, UserText
from dormant.stores.base import Commit, NewThread, StoredItem, ThreadInfo, ThreadStatus
from dormant.stores.sql.items import ItemCache
from dormant.stores.sql.store import SQLStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def info(thread_id: str = "t1", version: int = 1, created_at: datetime = T0) -> ThreadInfo:
    return ThreadInfo(
        id=thread_id,
        agent="a",
        status=ThreadStatus.IDLE,
        version=version,
        created_at=created_at,
        updated_at=created_at,
    )


def items(*seqs: int) -> tuple[StoredItem, ...]:
    return tuple(StoredItem(seq=s, message_id="", item=UserText(text=f"#{s}")) for s in seqs)


def test_a_cached_read_serves_the_same_or_a_later_version_of_the_same_thread_only() -> None:
    cache = ItemCache()
    cache.keep(info(version=3), items(1, 2))
    assert cache.known(info(version=3)) == items(1, 2)
    assert cache.known(info(version=5)) == items(1, 2)  # later items are read after seq 2
    assert cache.known(info(version=2)) == ()  # an older snapshot may not hold seq 2
    assert cache.known(info(version=9, created_at=T0 + timedelta(days=1))) == ()  # re-created


def test_an_older_snapshot_never_replaces_a_newer_read() -> None:
    cache = ItemCache()
    cache.keep(info(version=4), items(1, 2, 3))
    cache.keep(info(version=2), items(1))
    assert cache.known(info(version=4)) == items(1, 2, 3)


def test_the_least_recently_used_thread_is_dropped_first() -> None:
    one_item = len(ItemAdapter.dump_json(items(1)[0].item))
    cache = ItemCache(max_bytes=2 * one_item)
    cache.keep(info("a"), items(1))
    cache.keep(info("b"), items(1))
    cache.known(info("a"))
    cache.keep(info("c"), items(1))
    assert cache.known(info("b")) == ()
    assert cache.known(info("a")) == items(1) and cache.known(info("c")) == items(1)


def test_a_load_after_a_commit_reads_the_cached_items_and_the_new_ones(tmp_path: Path) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'items.db'}")
    try:
        from dormant.stores.sql.store import upgrade

        upgrade(f"sqlite:///{tmp_path / 'items.db'}")
        store.create_thread(NewThread(id="t1", agent="a", items=list(items(1))))
        assert [s.seq for s in store.load("t1").items] == [1]  # now cached
        snap = store.load("t1")
        for seq in (2, 3):
            commit = Commit(
                thread_id="t1",
                version=snap.thread.version,
                status=ThreadStatus.IDLE,
                inbox_seen=0,
                items=list(items(seq)),
            )
            assert store.commit(commit) is not None
            snap = store.load("t1")
        assert snap.items == list(items(1, 2, 3))
        assert store.history("t1") == list(items(1, 2, 3))
    finally:
        store.close()


def test_a_store_on_the_callers_connection_caches_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'caller.db'}"
    from dormant.stores.sql.store import upgrade

    upgrade(url)
    store = SQLStore(url)
    try:
        with store._engine.connect() as conn, conn.begin():
            view = store.on_connection(conn)
            view.create_thread(NewThread(id="t1", agent="a", items=list(items(1))))
            assert [s.seq for s in view.load("t1").items] == [1]
            assert view._items.known(view.thread("t1")) == ()
            conn.rollback()
        assert store._items.known(info("t1", version=0)) == ()
    finally:
        store.close()


def test_the_cache_is_bounded_by_the_items_bytes_and_keeps_no_thread_larger_than_it() -> None:
    one_item = len(ItemAdapter.dump_json(items(1)[0].item))
    cache = ItemCache(max_bytes=3 * one_item)
    cache.keep(info("a"), items(1))
    cache.keep(info("b"), items(1))
    cache.keep(info("c", version=2), items(1, 2))  # a and b (2 items) make room for it
    assert cache.known(info("a")) == () and cache.known(info("b")) == items(1)
    assert cache.known(info("c", version=2)) == items(1, 2)
    cache.keep(info("c", version=3), items(1, 2, 3, 4))  # larger than the whole cache
    assert cache.known(info("c", version=3)) == () and cache.known(info("b")) == items(1)


def test_an_entry_extended_by_a_later_read_is_measured_as_a_whole() -> None:
    one_item = len(ItemAdapter.dump_json(items(1)[0].item))
    cache = ItemCache(max_bytes=3 * one_item)
    first = items(1, 2)
    cache.keep(info("a", version=2), first)
    cache.keep(info("a", version=3), first + items(3))  # fills the cache exactly
    cache.keep(info("b"), items(1))
    assert cache.known(info("a", version=3)) == () and cache.known(info("b")) == items(1)


def test_the_history_cache_bound_is_a_setting_in_mib(tmp_path: Path) -> None:
    """Issue 35, part 3: ``DORMANT_HISTORY_CACHE_MIB`` bounds the cache of the store a
    ``LocalSystem`` (and a worker, and a client) opens; 0 turns it off."""
    import pytest

    from dormant import Agent, LocalSystem, Settings
    from dormant.errors import ConfigurationError
    from dormant.models import ScriptedModel, reply

    assert Settings().history_cache_mib == 8.0
    settings = Settings.from_env({"DORMANT_HISTORY_CACHE_MIB": "0.5"})
    assert settings.history_cache_bytes == 512 * 1024
    with pytest.raises(ConfigurationError, match="history_cache_mib"):
        Settings(history_cache_mib=-1)
    agent = Agent("a", model=ScriptedModel(lambda items: reply("done")))
    tiny = settings.with_(history_cache_mib=16 / 1024 / 1024)  # 16 bytes: no item fits
    for bound, cached in ((tiny, ()), (settings.with_(history_cache_mib=0), ())):
        url = f"sqlite:///{tmp_path / f'{bound.history_cache_bytes}.db'}"
        with LocalSystem([agent], url, settings=bound) as system:
            thread_id = system.launch("a", "hello")
            system.run_until_idle(timeout_s=30)
            store = system.store
            assert isinstance(store, SQLStore)
            snap = store.load(thread_id)  # its history: larger than either bound
            assert len(snap.items) == 2
            assert store._items.known(snap.thread) == cached
    with LocalSystem([agent], f"sqlite:///{tmp_path / 'default.db'}", settings=settings) as system:
        thread_id = system.launch("a", "hello")
        system.run_until_idle(timeout_s=30)
        store = system.store
        assert isinstance(store, SQLStore)
        snap = store.load(thread_id)
        assert store._items.known(snap.thread) == tuple(snap.items)  # 0.5 MiB holds it
