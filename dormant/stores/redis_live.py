"""``RedisLive``: the live log of streams in Redis, one capped Redis Stream per watched thread.

Three keys a thread, all under ``Settings.key_prefix``: ``watch:{id}`` (set by readers with a
time-to-live: while it exists, writers append), ``live:{id}`` (the Stream, ``XADD MAXLEN ~``)
and ``livemeta:{id}`` (a hash: ``c`` the committed boundary, ``lc``/``ln`` the last entry's
id, ``partial`` the attempt whose text is pending, ``closed`` the id of the close). Readers
refresh the three's time-to-live; nobody reading, they expire.

Writers append in Lua (``LIVE_LUA``), inside the scripts that already publish the slice's
events (``dormant.stores.redis``): an unwatched thread costs one ``EXISTS`` per script, no
round trip. Entry ids are the stream ids ``c-n`` (``dormant.streams``), ``n`` from Redis's
clock in microseconds, bumped to stay increasing: after a flush the log starts again above
every id given before, with a ``start`` entry that tells readers text may be lost.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import redis
import redis.asyncio

from dormant.messages import Chunk, Event, ItemAdded, StatusChanged
from dormant.streams import LiveEntry

__all__ = ["LIVE_KEEP", "LIVE_LUA", "RedisLive", "live_args", "live_keys"]

LIVE_KEEP = 1000
"""About how many entries a thread's live log keeps (``MAXLEN ~``): at one chunk every
50 ms, the last minute of a long answer."""

LIVE_LUA = """
local function live_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function live_add(ks, km, c, n, kind, data, maxlen)
  local lc = tonumber(redis.call('HGET', km, 'lc') or '-1')
  local ln = tonumber(redis.call('HGET', km, 'ln') or '-1')
  if n == nil then
    n = live_now()
    if lc == c and n <= ln then n = ln + 1 end
  end
  if c < lc or (c == lc and n <= ln) then
    return nil
  end
  local cs, ns = string.format('%d', c), string.format('%d', n)
  -- pcall: a refused id (a log another writer moved on) must not abort the caller's script
  local id = cs .. '-' .. ns
  local added = redis.pcall('XADD', ks, 'MAXLEN', '~', maxlen, id, 'k', kind, 'd', data)
  if type(added) == 'table' and added.err then
    return nil
  end
  redis.call('HSET', km, 'lc', cs, 'ln', ns)
  return cs .. '.' .. ns
end
local function live_append(kw, ks, km, kind, data, attempt, seq, status, maxlen)
  if redis.call('EXISTS', kw) == 0 then
    return
  end
  local known = redis.call('HGET', km, 'c')
  if not known then
    return
  end
  local c = tonumber(known)
  if kind == 'item' then
    local cid = tonumber(seq) + 1
    if cid > c then
      redis.call('HSET', km, 'c', string.format('%d', cid))
    end
    if status == 'assistant' then
      redis.call('HDEL', km, 'partial')  -- the answer is in: its text is no longer pending
    end
    live_add(ks, km, cid, 0, kind, data, maxlen)
    return
  end
  local partial = redis.call('HGET', km, 'partial')
  if kind == 'chunk' then
    if tonumber(string.match(attempt, '^(%d+):') or '0') < c then
      return  -- the text of a turn whose items the log holds: they supersede it
    end
    if partial and partial ~= attempt then
      live_add(ks, km, c, nil, 'retry', cjson.encode({reason =
        "the model's answer was abandoned and is being retried"}), maxlen)
    end
    redis.call('HSET', km, 'partial', attempt)
  elseif kind == 'status' and partial then
    live_add(ks, km, c, nil, 'retry', cjson.encode({reason =
      'the turn was abandoned: the thread is now ' .. status}), maxlen)
    redis.call('HDEL', km, 'partial')
  end
  local id = live_add(ks, km, c, nil, kind, data, maxlen)
  if id and kind == 'status' and status == 'closed' then
    redis.call('HSET', km, 'closed', id)
  end
end
"""
"""Lua functions for the scripts that publish events: ``live_append(watch, stream, meta,
kind, json, attempt, seq, label, maxlen)`` appends one event if its thread is watched
(``status`` in the Lua is the label: a status's value, or an item's kind)."""

# KEYS: watch, stream, meta; ARGV: c (or ""), ttl in ms, maxlen. Marks the thread watched, raises
# the boundary to c, and starts the log (a "start" entry) if it has none.
_WATCH = (
    LIVE_LUA
    + """
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
if ARGV[1] ~= '' then
  local c = tonumber(ARGV[1])
  local known = redis.call('HGET', KEYS[3], 'c')
  if not known or tonumber(known) < c then
    redis.call('HSET', KEYS[3], 'c', ARGV[1])
  end
  if redis.call('EXISTS', KEYS[2]) == 0 then
    local at = tonumber(redis.call('HGET', KEYS[3], 'c'))
    live_add(KEYS[2], KEYS[3], at, nil, 'start', '{}', ARGV[3])
  end
end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
"""
)


def live_keys(prefix: str, thread_id: str) -> list[str]:
    """The thread's watch mark, Stream and meta hash."""
    return [
        f"{prefix}:watch:{thread_id}",
        f"{prefix}:live:{thread_id}",
        f"{prefix}:livemeta:{thread_id}",
    ]


def live_args(event: Event, data: str) -> list[str]:
    """The ``live_append`` arguments of ``event`` after its keys: kind, JSON, attempt, seq,
    label (a status's value or an item's kind)."""
    attempt = event.attempt if isinstance(event, Chunk) else ""
    seq = str(event.seq) if isinstance(event, ItemAdded) else "0"
    label = ""  # a status's value, or an item's kind
    if isinstance(event, StatusChanged):
        label = event.status
    elif isinstance(event, ItemAdded):
        label = event.item.kind
    return [event.kind, data, attempt, seq, label]


_MAX_BLOCK_MS = 4000
"""The longest ``XREAD BLOCK``: well inside the clients' socket timeouts (10 s, 15 s), so a
wait is never mistaken for a dead Redis; a reader simply asks again."""


def _entry(stream_id: str, fields: dict[str, str]) -> LiveEntry:
    c, _, n = stream_id.partition("-")
    data: dict[str, Any] = json.loads(fields["d"])
    return LiveEntry(int(c), int(n), fields["k"], data)


class RedisLive:
    """``LiveLog`` over Redis Streams; ``aread`` uses its own asyncio client, made on first
    use in the running loop."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        url: str | None = None,
        keep: int = LIVE_KEEP,
        ttl_s: float = 30.0,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._url = url
        self.keep = keep
        self.ttl_s = ttl_s
        self._watch = client.register_script(_WATCH)
        self._async: redis.asyncio.Redis | None = None
        self._async_loop: asyncio.AbstractEventLoop | None = None

    def keys(self, thread_id: str) -> list[str]:
        return live_keys(self._prefix, thread_id)

    def watch(self, thread_id: str, c: int | None) -> None:
        ttl_ms = max(1, int(self.ttl_s * 1000))
        self._watch(keys=self.keys(thread_id), args=["" if c is None else c, ttl_ms, self.keep])

    def read(self, thread_id: str, after: tuple[int, int], block_s: float) -> list[LiveEntry]:
        stream = self.keys(thread_id)[1]
        last = f"{after[0]}-{after[1]}"
        block_ms = min(int(block_s * 1000), _MAX_BLOCK_MS)
        # XREAD BLOCK 0 waits for ever: an immediate answer is a plain XRANGE.
        if block_ms <= 0:
            raw = self._client.xrange(stream, f"({last}", "+", count=self.keep)
            return [_entry(i, f) for i, f in cast(list[Any], raw)]
        answer = self._client.xread({stream: last}, count=self.keep, block=block_ms)
        return _entries(answer)

    async def aread(
        self, thread_id: str, after: tuple[int, int], block_s: float
    ) -> list[LiveEntry]:
        loop = asyncio.get_running_loop()
        if self._async is None or self._async_loop is not loop:  # a client serves one loop
            if self._url is None:
                raise RuntimeError("RedisLive needs url= to read without a thread")
            self._async_loop = loop
            self._async = redis.asyncio.Redis.from_url(
                self._url, decode_responses=True, socket_connect_timeout=5, socket_timeout=15
            )
        stream = self.keys(thread_id)[1]
        last = f"{after[0]}-{after[1]}"
        block_ms = min(int(block_s * 1000), _MAX_BLOCK_MS)
        if block_ms <= 0:
            raw = await self._async.xrange(stream, f"({last}", "+", count=self.keep)
            return [_entry(i, f) for i, f in cast(list[Any], raw)]
        answer = await self._async.xread({stream: last}, count=self.keep, block=block_ms)
        return _entries(answer)

    def closed_at(self, thread_id: str) -> tuple[int, int] | None:
        raw = self._client.hget(self.keys(thread_id)[2], "closed")
        if not raw:
            return None
        c, _, n = cast(str, raw).partition(".")
        return int(c), int(n)

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None


def _entries(answer: Any) -> list[LiveEntry]:
    if not answer:
        return []
    _stream, raw = answer[0]
    return [_entry(i, f) for i, f in raw]
