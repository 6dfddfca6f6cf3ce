"""A TCP proxy in front of the broker's Redis that loses one published task on demand.

Every client of the broker (workers, beat, the driver's clients) reaches it through this
proxy; dormant's own Redis (leases, wake marks) is reached directly. While a drop is armed
(``DROP_ARMED`` in the stats Redis, naming ``dormant.slice`` or ``dormant.tool``), the next
task of that name pushed onto a dormant queue (``LPUSH``, or the ``RPUSH`` of a restore) is
pushed onto ``LOST_KEY`` instead, a list no worker reads. The publisher gets the broker's
own reply, as from a broker that took the message and then lost it: no worker ever runs the
task, and only the sweeper, re-driving from SQL, recovers the work (a slice wake once its
wake mark expires, a tool task once ``tool_start_timeout_s`` passes without a start). The
command is rewritten rather than swallowed so that every reply still comes from Redis, in
order, also inside a pipeline or ``MULTI``.

A drop waits for a task to be published, so it always finds one while the system works: it
needs no queued message, which Redis hands at once to a worker blocked in ``BRPOP``.
Run as ``python -m chaos.proxy --port P --upstream-port U --stats-url URL``; ``BrokerProxy``
starts it and arms its drops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
import redis.asyncio

from chaos.services import free_port, redis_answers
from dormant.celery.config import QUEUES, SLICE_TASK, TOOL_TASK

__all__ = [
    "DROPPABLE",
    "DROPPED",
    "DROP_ARMED",
    "LOST_KEY",
    "BrokerProxy",
    "encode_command",
    "parse_command",
    "published_task",
]

DROP_ARMED = "chaos:drop:armed"
"""Set in the stats Redis to the name of the task to drop; deleted when one is dropped."""
DROPPED = "chaos:drop:dropped"
"""A list in the stats Redis: each dropped task, as ``"<task name> <kwargs>"``."""
LOST_KEY = b"chaos:lost-tasks"
"""Where a dropped task goes in the broker's Redis: no worker reads it."""
_PUSHES = frozenset({b"LPUSH", b"RPUSH"})
DROPPABLE = (SLICE_TASK, TOOL_TASK)
"""The tasks whose loss the sweeper must make good (a sweep's loss is made good by the next)."""
_QUEUE_NAMES = tuple(q.encode() for q in QUEUES)
_PRIORITY_SEP = b"\x06\x16"
"""kombu's separator between a queue's name and its priority step (``dormant.tools\\x06\\x163``)."""
_CHUNK_BYTES = 65536

# KEYS[1] DROP_ARMED, KEYS[2] DROPPED, ARGV[1] the task's name, ARGV[2] the task: 1 if this
# task is the one dropped. One script, so the fault that armed the drop sees it disarmed
# only once the task is noted.
_TAKE_DROP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


def parse_command(buffer: bytes | bytearray, start: int = 0) -> tuple[list[bytes], int] | None:
    """The RESP command (an array of bulk strings, all redis-py sends) at ``start``, and the
    offset after it; None while it is incomplete. ``ValueError`` if it is not one."""
    if start >= len(buffer):
        return None
    if buffer[start : start + 1] != b"*":
        raise ValueError(
            f"not a RESP array at offset {start}: {bytes(buffer[start : start + 20])!r}"
        )
    line_end = buffer.find(b"\r\n", start)
    if line_end < 0:
        return None
    count = int(buffer[start + 1 : line_end])
    at = line_end + 2
    parts: list[bytes] = []
    for _ in range(count):
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        if buffer[at : at + 1] != b"$":
            raise ValueError(f"not a bulk string at offset {at}")
        begin = line_end + 2
        end = begin + int(buffer[at + 1 : line_end])
        if len(buffer) < end + 2:
            return None
        parts.append(bytes(buffer[begin:end]))
        at = end + 2
    return parts, at


def encode_command(parts: list[bytes]) -> bytes:
    encoded = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        encoded += [f"${len(part)}\r\n".encode(), part, b"\r\n"]
    return b"".join(encoded)


def published_task(parts: list[bytes]) -> str | None:
    """``"<task name> <kwargs>"`` if the command pushes one slice or tool task message onto
    a dormant queue (kombu pushes one message per command), else None."""
    if len(parts) != 3 or parts[0].upper() not in _PUSHES:
        return None
    queue = parts[1].split(_PRIORITY_SEP, 1)[0]
    if not queue.endswith(_QUEUE_NAMES):
        return None
    try:
        headers = json.loads(parts[2])["headers"]
        name = headers["task"]
    except (ValueError, KeyError, TypeError):
        return None
    return f"{name} {headers.get('kwargsrepr', '')}" if name in DROPPABLE else None


async def _commands(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, stats: redis.asyncio.Redis
) -> None:
    """Copy the client's commands upstream, diverting the task an armed drop takes."""
    take_drop = stats.register_script(_TAKE_DROP)
    pending = bytearray()
    while chunk := await source.read(_CHUNK_BYTES):
        pending += chunk
        out = bytearray()
        at = 0
        try:
            while (parsed := parse_command(pending, at)) is not None:
                parts, end = parsed
                task = published_task(parts)
                name = task.split(" ", 1)[0] if task is not None else ""
                if task and await take_drop(keys=[DROP_ARMED, DROPPED], args=[name, task]):
                    out += encode_command([parts[0], LOST_KEY, parts[2]])
                else:
                    out += pending[at:end]
                at = end
        except ValueError:  # not RESP after all: from here on, bytes are only copied
            sink.write(bytes(out + pending[at:]))
            await _copy(source, sink)
            return
        del pending[:at]
        sink.write(bytes(out))
        await sink.drain()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while chunk := await source.read(_CHUNK_BYTES):
        sink.write(chunk)
        await sink.drain()


async def _serve(port: int, upstream_port: int, stats_url: str) -> None:
    stats = redis.asyncio.Redis.from_url(stats_url)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client's connection, paired with its own to Redis: when either side closes
        (Redis killed, a client gone), so does the other, as without a proxy."""
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.create_task(_commands(reader, up_writer, stats)),
            asyncio.create_task(_copy(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for side in (writer, up_writer):
                side.close()

    server = await asyncio.start_server(connection, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@dataclass
class BrokerProxy:
    """The proxy as a subprocess of the chaos run, and the fault that makes it drop a task."""

    directory: Path
    upstream_port: int
    stats_url: str
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 60.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "chaos.proxy", "--port", str(self.port)]
        argv += ["--upstream-port", str(self.upstream_port), "--stats-url", self.stats_url]
        with (self.directory / "proxy.log").open("ab") as log:
            self.process = subprocess.Popen(
                argv, cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout_s
        while not redis_answers(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise TimeoutError(f"the broker proxy on port {self.port} did not start")
            time.sleep(0.05)

    def exited(self) -> int | None:
        """The exit code if the proxy died, else None."""
        return None if self.process is None else self.process.poll()

    def drop_next_task(self, name: str, within_s: float) -> str | None:
        """Arm a drop and wait for the proxy to lose the next task ``name`` published (one
        of ``DROPPABLE``): the task dropped, or None if none was published within
        ``within_s`` (then disarmed)."""
        stats = redis.Redis.from_url(self.stats_url, decode_responses=True)
        try:
            stats.set(DROP_ARMED, name)
            deadline = time.monotonic() + within_s
            while time.monotonic() < deadline and stats.exists(DROP_ARMED):
                time.sleep(0.02)
            if stats.delete(DROP_ARMED):  # still armed: nothing was published
                return None
            return str(stats.lindex(DROPPED, -1))
        finally:
            stats.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chaos.proxy", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--stats-url", required=True)
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.upstream_port, args.stats_url))


if __name__ == "__main__":
    main()
