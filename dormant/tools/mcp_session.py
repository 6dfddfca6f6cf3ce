"""One MCP session per server per process, shared by every call the process makes.

Starting a stdio server costs a process start and, for a Python server, the SDK's import
(about a second on an idle machine); a session per call paid that on every call. Here a
process keeps one session per server on one event loop, in a daemon thread named
``dormant-mcp``, and every tool thread of the process uses it at once: MCP requests carry
ids, so concurrent calls share the connection.

- **Started lazily**, by the first call that needs it. The start (spawning a stdio server,
  or connecting, and the handshake) is bounded by the server's ``list_timeout_s``, and it
  is not given up when the call waiting for it reaches its own ``call_timeout_s``: the
  next call finds the server ready.
- **Restarted when it dies**: when a server's connection ends (a stdio server exits), the
  session is dropped and the next call starts a new one. A call in flight when the server
  dies fails and is not retried: the tool may have done its work before the server died,
  and only the model can tell whether to call it again.
- **Retired after any other failure of a call** (a timeout, a protocol error; not the
  tool's own error result): later calls get a fresh session, and the old one closes once
  its calls in flight are over, so a stuck call does not take the others with it.
- **Closed** by ``close_mcp_sessions()``: on worker shutdown (``dormant.worker.install``
  connects it), in ``LocalSystem.close``, and at interpreter exit. Closing is the SDK's
  shutdown: close the server's stdin, then SIGTERM and SIGKILL its process group, and reap
  it, so no server outlives the process or lingers as a zombie.
- **Per process**: a forked child (a prefork worker) never touches its parent's sessions
  (``os.register_at_fork``): it makes its own.

Listing (``run_once``) uses a session of its own, started, used and closed on the caller's
thread: a process that only imports the agents (a client, beat, a prefork parent) keeps no
server running.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from anyio.abc import ObjectSendStream, TaskGroup, TaskStatus
    from anyio.from_thread import BlockingPortal
    from mcp import ClientSession

    from dormant.tools.mcp import McpServer

__all__ = ["call_in_session", "close_mcp_sessions", "run_once"]

_T = TypeVar("_T")
Work = Callable[["ClientSession"], Awaitable[_T]]

log = logging.getLogger("dormant.tools")

_CLOSE_TIMEOUT_S = 10.0
"""How long closing waits for the servers to stop: the SDK's own shutdown of one server
takes 6.5 s at most (stdin closed, 2 s, SIGTERM, 2 s, SIGKILL, 2 s), all run at once."""


def run_once(server: McpServer, work: Work[_T], timeout_s: float) -> _T:
    """``work`` in a session of its own, on a fresh event loop in this thread: start,
    handshake and work within ``timeout_s`` (the server's shutdown after it is the SDK's,
    bounded)."""
    import anyio

    async def main() -> _T:
        with anyio.fail_after(timeout_s):
            async with AsyncExitStack() as stack:
                read, write = await _connect(server, stack)
                return await work(await _open(stack, read, write))

    return anyio.run(main)


def call_in_session(server: McpServer, work: Work[_T]) -> _T:
    """``work`` in this process's session with ``server``, within ``call_timeout_s``
    counted from now (a start it waits for included). Raises ``TimeoutError`` when the time
    is up, whatever the event loop is doing, and any other failure as it is."""
    pool = _PROCESS.pool()
    future: Future[_T] = pool.portal.start_task_soon(pool.call, server, work)
    try:
        return future.result(timeout=server.call_timeout_s)
    except TimeoutError:
        # This wait or the loop's own deadline, whichever ends first: the caller is free
        # on time even when the loop is too busy to notice its deadline.
        future.cancel()
        raise


def close_mcp_sessions() -> None:
    """Close every MCP session of this process and stop their servers (at most ~10 s).
    Harmless when there are none; a later call starts its session again."""
    _PROCESS.close()


class _Process:
    """This process's pool: made on first use, and again after a close or a fork (a child
    forgets its parent's pool, whose loop thread it does not have, without closing it)."""

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()  # a parent's thread may have held it at the fork
        self._pool: _Pool | None = None

    def pool(self) -> _Pool:
        with self._lock:
            if self._pool is None:
                self._pool = _Pool()
                atexit.unregister(close_mcp_sessions)  # registered once, whatever the pools
                atexit.register(close_mcp_sessions)
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


class _Pool:
    """An event loop in a daemon thread, and the sessions on it (touched only there)."""

    def __init__(self) -> None:
        from anyio.from_thread import start_blocking_portal

        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal(
            name="dormant-mcp"
        )
        self.portal = self._portal_cm.__enter__()
        self._sessions: dict[tuple[Any, ...], _Session] = {}
        """The session each server's next call uses."""
        self._running: set[_Session] = set()
        """Every session still open, those retired included."""
        self._supervisor, _ = self.portal.start_task(self._supervise)

    async def _supervise(self, *, task_status: TaskStatus[None]) -> None:
        import anyio

        self._closing = anyio.Event()
        async with anyio.create_task_group() as group:
            self._group: TaskGroup = group
            task_status.started()
            await self._closing.wait()
            for session in self._running:
                session.stop()

    async def call(self, server: McpServer, work: Work[_T]) -> _T:
        import anyio

        with anyio.fail_after(server.call_timeout_s):
            session = await self._live(server)
            client = session.client
            assert client is not None
            session.in_flight += 1
            try:
                return await work(client)
            except BaseException:
                session.retire()
                raise
            finally:
                session.in_flight -= 1
                if session.retired and not session.in_flight:
                    session.stop()

    async def _live(self, server: McpServer) -> _Session:
        """The server's session, started if it has none or its last one ended."""
        if self._closing.is_set():
            raise ConnectionError("the MCP sessions of this process are closing")
        session = self._sessions.get(server.key)
        if session is None or session.retired or session.ended:
            session = _Session(server)
            self._sessions[server.key] = session
            self._group.start_soon(self._own, session)
        await session.ready.wait()
        if session.client is None or session.ended:
            if self._sessions.get(server.key) is session:
                del self._sessions[server.key]  # the next call tries a start again
            raise session.error or ConnectionError("the server closed the connection")
        return session

    async def _own(self, session: _Session) -> None:
        self._running.add(session)
        try:
            await session.run()
        finally:
            self._running.discard(session)

    def close(self) -> None:
        """Stop every session (their servers with them), then the loop and its thread."""

        async def begin() -> None:
            self._closing.set()

        try:
            self.portal.call(begin)
            self._supervisor.result(timeout=_CLOSE_TIMEOUT_S)
        except Exception:
            log.warning("closing the MCP sessions did not finish cleanly", exc_info=True)
        finally:
            self.portal.call(self.portal.stop, True)
            self._portal_cm.__exit__(None, None, None)


class _Session:
    """One connection to a server, opened, held and closed by its own task (``run``)."""

    def __init__(self, server: McpServer) -> None:
        import anyio

        self.server = server
        self.client: ClientSession | None = None
        self.error: Exception | None = None
        self.ready = anyio.Event()
        self.ended = False
        self.retired = False
        self.in_flight = 0
        self._stop = anyio.Event()

    def retire(self) -> None:
        """Take no more calls; close once the calls in flight are over."""
        self.retired = True
        if not self.in_flight:
            self.stop()

    def stop(self) -> None:
        self.retired = True
        self._stop.set()

    async def run(self) -> None:
        import anyio

        timeout_s = self.server.list_timeout_s
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + timeout_s) as scope:
                async with AsyncExitStack() as stack:
                    read, write = await _connect(server=self.server, stack=stack)
                    self.client = await _open(stack, await self._watch(stack, read), write)
                    scope.deadline = math.inf
                    self.ready.set()
                    await self._stop.wait()
            if scope.cancelled_caught and not self.ready.is_set():
                self.error = TimeoutError(f"starting the server took longer than {timeout_s:g} s")
        except Exception as error:
            self.error = error
        finally:
            self.ended = True
            self.ready.set()

    async def _watch(self, stack: AsyncExitStack, read: Any) -> Any:
        """``read``, passed on through a stream of our own, to learn when it ends."""
        import anyio

        send, receive = anyio.create_memory_object_stream[Any](0)
        group = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(group.cancel_scope.cancel)  # unwinds before the group is awaited
        group.start_soon(self._pump, read, send)
        return receive

    async def _pump(self, read: Any, send: ObjectSendStream[Any]) -> None:
        import anyio

        try:
            async with send:
                async for item in read:
                    await send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            if not self._stop.is_set():
                log.warning(
                    "MCP server %r closed the connection; the next call starts it again",
                    self.server.label,
                )
            self.ended = True
            self.stop()


async def _open(stack: AsyncExitStack, read: Any, write: Any) -> ClientSession:
    from mcp import ClientSession

    client = await stack.enter_async_context(ClientSession(read, write))
    await client.initialize()
    return client


async def _connect(server: McpServer, stack: AsyncExitStack) -> tuple[Any, Any]:
    """The transport's (read, write) streams; ``stack`` closes it (a stdio server stops)."""
    if server.url is not None:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        # The transport leaves a client it is given open: the stack closes it, even
        # when a timeout cancels the call mid-request.
        client = create_mcp_http_client(headers=dict(server.headers or {}))
        await stack.enter_async_context(client)
        transport = streamable_http_client(server.url, http_client=client)
    else:
        from mcp.client.stdio import StdioServerParameters, stdio_client

        command, *args = server.stdio
        env = dict(server.env) if server.env is not None else None
        transport = stdio_client(StdioServerParameters(command=command, args=args, env=env))
    read, write = await stack.enter_async_context(transport)
    return read, write


_PROCESS = _Process()
