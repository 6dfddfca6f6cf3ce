"""What a thread's stream costs: events per second one stream delivers, slice throughput with
0 and 100 listeners, and the memory of an open SSE connection in ``dormant serve``.

    python bench/stream.py [--threads 100] [--events 5000] [--connections 200]
        [--out bench/results/stream.json]

Needs the local Redis (db ``--redis-db``, 13; never 0) under a fresh key prefix, deleted at
the end. Agents run in this process (``LocalSystem``, memory store) and publish their events
to Redis through ``RedisEvents`` (the scripts a Celery worker's slices run), so the Redis
side is the deployment's; readers use ``RedisLive`` as ``Client.stream`` and ``dormant
serve`` do.

1. **Delivery**: one thread, ``--events`` chunks published 100 a script call (so the writer
   is not what is timed); events/s from the first publish to the reader's last event, for
   the sync reader (``Client.stream``) and the async one (``astream``, what SSE uses).
2. **Listeners**: ``--threads`` threads (SQLite file) run a streamed turn each
   (``SimulatedModel``, 1,200 characters in ~25 chunks), first with no reader, then with
   one async reader per thread in another process (100 open streams): slices/s, the
   ratio, and the CPU time per slice of the process running them (on a machine with few
   cores the listeners' own CPU shows in the wall-clock figure; the slices' does not move).
3. **SSE memory**: ``dormant serve`` on an SQLite file; ``--connections`` idle SSE
   connections opened on one thread's stream; the server's RSS before and after, per
   connection, and a ``/healthz`` answer time with all of them open.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from dormant import Agent, LocalSystem, Settings
from dormant.messages import Chunk
from dormant.models import SimulatedModel
from dormant.runtime.stream import StreamReader, astream, stream
from dormant.stores.redis import RedisEvents, redis_client
from dormant.stores.redis_live import RedisLive

HERE = Path(__file__).resolve().parent


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


class Rig:
    """A ``LocalSystem`` on an SQLite file whose events also go to Redis, and a Redis live
    log: the file lets listeners in another process read the store."""

    def __init__(self, redis_url: str, prefix: str, folder: Path) -> None:
        self.database_url = f"sqlite:///{folder / 'rig.db'}"
        self.settings = Settings(redis_url=redis_url, key_prefix=prefix, secret_keys=("bench",))
        model = SimulatedModel(completion_chars=1200, seed=7)
        agent = Agent("bench", model=model)
        self.system = LocalSystem([agent], self.database_url, settings=self.settings)
        self.redis = redis_client(self.settings)
        self.events = RedisEvents(self.redis, prefix)
        self.system.on_event(self.events.publish)
        self.live = RedisLive(self.redis, prefix, url=redis_url)

    def close(self) -> None:
        self.system.close()
        keys = list(self.redis.scan_iter(match=f"{self.settings.key_prefix}*", count=1000))
        if keys:
            self.redis.delete(*keys)
        self.redis.close()


def _consume(rig: Rig, thread_id: str, events: int, mode: str) -> None:
    reader = StreamReader(thread_id, rig.system.store, rig.live)
    chunks = 0
    if mode == "sync":
        for event in stream(reader, timeout_s=30):
            chunks += event.type == "chunk"
            if chunks == events:
                return
        return

    async def run() -> None:
        seen = 0
        async for event in astream(reader, timeout_s=30):
            seen += event.type == "chunk"
            if seen == events:
                break
        await rig.live.aclose()

    asyncio.run(run())


def delivery(rig: Rig, events: int) -> dict[str, float]:
    """Events/s from publishing ``events`` chunks to a reader having read them all."""
    out: dict[str, float] = {}
    for mode in ("sync", "async"):
        thread_id = rig.system.launch("bench", "hello")
        rig.system.run_until_idle()
        consumer = threading.Thread(target=_consume, args=(rig, thread_id, events, mode))
        consumer.start()
        deadline = time.monotonic() + 30
        while not rig.redis.exists(rig.live.keys(thread_id)[1]):  # the reader watches
            if time.monotonic() > deadline:
                raise RuntimeError("the reader never watched the thread")
            time.sleep(0.01)
        started = time.monotonic()
        attempt = f"3:bench:{mode}"
        for first in range(0, events, 100):  # in batches: the reader, not the writer, is timed
            batch = range(first, min(events, first + 100))
            rig.events.publish_all(
                [Chunk(thread_id=thread_id, text=f"w{i} ", attempt=attempt) for i in batch]
            )
        consumer.join(60)
        out[f"{mode}_events_per_s"] = events / (time.monotonic() - started)
    return out


_LISTEN = """
import asyncio, sys
from dormant.stores.redis import redis_client
from dormant.stores.redis_live import RedisLive
from dormant.stores.sql.store import SQLStore
from dormant.runtime.stream import StreamReader
from dormant.settings import Settings

database_url, redis_url, prefix, *ids = sys.argv[1:]
store = SQLStore(database_url)
live = RedisLive(redis_client(Settings(redis_url=redis_url)), prefix, url=redis_url)

async def one(thread_id):
    reader = StreamReader(thread_id, store, live)
    while True:
        await reader.apoll(1.0)

async def main():
    tasks = [asyncio.create_task(one(t)) for t in ids]
    await asyncio.sleep(2.0)
    print("ready", flush=True)
    await asyncio.gather(*tasks)

asyncio.run(main())
"""


def listeners(rig: Rig, threads: int) -> dict[str, float]:
    """Slices/s of ``threads`` streamed turns, without and with one reader per thread; the
    readers are another process (as a web server's would be)."""
    ids = [rig.system.launch("bench", "warm up") for _ in range(threads)]
    rig.system.run_until_idle(timeout_s=600)
    results: dict[str, float] = {}
    for label in ("no_listeners", "listeners"):
        listening: subprocess.Popen[str] | None = None
        if label == "listeners":
            argv = [rig.database_url, rig.settings.redis_url, rig.settings.key_prefix, *ids]
            listening = subprocess.Popen(
                [sys.executable, "-c", _LISTEN, *argv], stdout=subprocess.PIPE, text=True
            )
            assert listening.stdout is not None
            if listening.stdout.readline().strip() != "ready":
                raise RuntimeError("the listeners did not start")
        started, cpu_s = time.monotonic(), time.process_time()
        for thread_id in ids:
            rig.system.send(thread_id, f"{label}: go on")
        rig.system.run_until_idle(timeout_s=600)
        results[f"{label}_slices_per_s"] = threads / (time.monotonic() - started)
        results[f"{label}_cpu_ms_per_slice"] = 1000 * (time.process_time() - cpu_s) / threads
        if listening is not None:
            listening.kill()
            listening.wait(30)
    results["ratio"] = results["listeners_slices_per_s"] / results["no_listeners_slices_per_s"]
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def sse_memory(redis_url: str, prefix: str, connections: int) -> dict[str, float]:
    """RSS of ``dormant serve`` with ``connections`` idle SSE streams open."""
    folder = Path(tempfile.mkdtemp(prefix="dormant-stream-bench-"))
    database_url = f"sqlite:///{folder / 'dormant.db'}"
    port = free_port()
    env = {
        **os.environ,
        "DORMANT_DATABASE_URL": database_url,
        "DORMANT_SECRET_KEY": "bench",
        "DORMANT_CALLBACK_BASE_URL": f"http://127.0.0.1:{port}/dormant/callbacks",
        "DORMANT_REDIS_URL": redis_url,
        "DORMANT_BROKER_URL": redis_url,
        "DORMANT_KEY_PREFIX": prefix,
    }
    settings = Settings.from_env(env)
    with LocalSystem([Agent("bench", model=SimulatedModel(seed=1))], settings=settings) as system:
        thread_id = system.launch("bench", "hello")
        system.run_until_idle()
        url = system.stream_url(thread_id)
    server = subprocess.Popen(
        [sys.executable, "-m", "dormant", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        # one stream first, so what every stream shares (the async Redis client) is counted
        # before the baseline
        return asyncio.run(_open_streams(url, server.pid, base, connections))
    finally:
        server.terminate()
        server.wait(30)


async def _open_streams(url: str, pid: int, base: str, connections: int) -> dict[str, float]:
    host, port = "127.0.0.1", int(base.rsplit(":", 1)[1])
    target = url.split(f":{port}", 1)[1]
    request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"

    async def open_one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request.encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(head.decode(errors="replace"))
        await reader.readuntil(b"event: item")  # the history arrived: the stream is live
        return reader, writer

    first = [await open_one()]
    await asyncio.sleep(1.0)
    before = rss_bytes(pid)
    opened = [await open_one() for _ in range(connections)]
    await asyncio.sleep(2.0)
    after = rss_bytes(pid)
    started = time.monotonic()
    async with httpx.AsyncClient() as web:
        await web.get(f"{base}/healthz")
    healthz_s = time.monotonic() - started
    for _, writer in first + opened:
        writer.close()
    return {
        "connections": float(connections),
        "rss_before_bytes": float(before),
        "rss_after_bytes": float(after),
        "bytes_per_connection": (after - before) / connections,
        "healthz_with_all_open_s": healthz_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument(
        "--redis", default=os.environ.get("DORMANT_BENCH_REDIS", "redis://127.0.0.1:6379")
    )
    parser.add_argument("--redis-db", type=int, default=13)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "stream.json")
    args = parser.parse_args()
    if args.redis_db == 0:
        parser.error("--redis-db 0 is where real deployments live: pick another")
    redis_url = f"{args.redis.rstrip('/')}/{args.redis_db}"
    prefix = f"dstreambench{secrets.token_hex(4)}"
    rig = Rig(redis_url, prefix, Path(tempfile.mkdtemp(prefix="dormant-stream-bench-")))
    try:
        result: dict[str, Any] = {"delivery": delivery(rig, args.events)}
        emit({"delivery": result["delivery"]})
        result["listeners"] = listeners(rig, args.threads)
        emit({"listeners": result["listeners"]})
    finally:
        rig.close()
    try:
        result["sse"] = sse_memory(redis_url, prefix + "sse", args.connections)
        emit({"sse": result["sse"]})
    finally:
        conn = redis.Redis.from_url(redis_url)
        keys = list(conn.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            conn.delete(*keys)
        conn.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    emit({"result": result})


if __name__ == "__main__":
    main()
