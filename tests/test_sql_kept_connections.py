"""A SQLite file's direct transactions run on one connection per thread (``stores/sql/kept.py``),
closed with the store, with their thread, and never shared across a fork."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sqlalchemy import event

from dormant.stores.base import NewThread
from dormant.stores.sql.store import SQLStore, upgrade


def _store(tmp_path: Path) -> tuple[SQLStore, list[object]]:
    url = f"sqlite:///{tmp_path}/kept.db"
    upgrade(url)
    store = SQLStore(url)
    checkouts: list[object] = []
    event.listen(store._engine, "checkout", lambda *args: checkouts.append(args))
    return store, checkouts


def _open_files(path: Path) -> int:
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path))


def test_a_thread_runs_its_transactions_on_one_kept_connection(tmp_path: Path) -> None:
    store, checkouts = _store(tmp_path)
    thread_id = store.create_thread(NewThread(id="thr_k", agent="a")).id
    checkouts.clear()
    for _ in range(50):
        store.load(thread_id)
    assert len(checkouts) == 1  # through the pool, one a transaction: 50
    store.close()


def test_kept_connections_close_with_their_thread_and_with_the_store(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    db = tmp_path / "kept.db"
    thread_id = store.create_thread(NewThread(id="thr_k", agent="a")).id
    for _ in range(6):  # threads that come and go (a web server's): their files do not pile up
        worker = threading.Thread(target=store.load, args=(thread_id,))
        worker.start()
        worker.join()
    assert _open_files(db) <= 2  # the last thread's, and the pool's
    store.close()
    assert _open_files(db) == 0


def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents(tmp_path: Path) -> None:
    store, checkouts = _store(tmp_path)
    thread_id = store.create_thread(NewThread(id="thr_k", agent="a")).id
    store.load(thread_id)
    checkouts.clear()
    pid = os.fork()
    if pid == 0:  # the child: its own connection; the parent's is neither used nor closed
        try:
            store.load(thread_id)
            store.close()
        except BaseException:
            os._exit(2)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.create_thread(NewThread(id="thr_after", agent="a"))  # the parent's still works
    assert store.load("thr_after").thread.id == "thr_after"
    assert len(checkouts) == 1  # create_thread's, through the pool: the kept one still serves
    store.close()
