"""One frozen ``Settings``, built explicitly; every environment name lives here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dormant.errors import ConfigurationError
from dormant.rate_limit import RateLimit

__all__ = ["ENV_NAMES", "Settings", "redact"]

ENV_NAMES = {
    "database_url": "DORMANT_DATABASE_URL",
    "broker_url": "DORMANT_BROKER_URL",
    "redis_url": "DORMANT_REDIS_URL",
    "secret_keys": "DORMANT_SECRET_KEY",
    "callback_base_url": "DORMANT_CALLBACK_BASE_URL",
    "key_prefix": "DORMANT_KEY_PREFIX",
    "agents_module": "DORMANT_AGENTS",
    "crash_points": "DORMANT_CRASH_POINTS",
    "lease_ttl_s": "DORMANT_LEASE_TTL_S",
    "sweep_interval_s": "DORMANT_SWEEP_INTERVAL_S",
    "outbox_grace_s": "DORMANT_OUTBOX_GRACE_S",
    "visibility_timeout_s": "DORMANT_VISIBILITY_TIMEOUT_S",
    "tool_claim_ttl_s": "DORMANT_TOOL_CLAIM_TTL_S",
    "tool_max_runs": "DORMANT_TOOL_MAX_RUNS",
    "tool_start_timeout_s": "DORMANT_TOOL_START_TIMEOUT_S",
    "announce_interval_s": "DORMANT_ANNOUNCE_INTERVAL_S",
    "name_gone_after_s": "DORMANT_NAME_GONE_AFTER_S",
    "hand_in_timeout_s": "DORMANT_HAND_IN_TIMEOUT_S",
    "broker_key_prefix": "DORMANT_BROKER_KEY_PREFIX",
    "max_message_bytes": "DORMANT_MAX_MESSAGE_BYTES",
    "model_attempts": "DORMANT_MODEL_ATTEMPTS",
    "model_backoff_s": "DORMANT_MODEL_BACKOFF_S",
    "stall_after_failures": "DORMANT_STALL_AFTER_FAILURES",
    "failure_backoff_s": "DORMANT_FAILURE_BACKOFF_S",
    "table_prefix": "DORMANT_TABLE_PREFIX",
    "debug": "DORMANT_DEBUG",
    "webhook_secrets": "DORMANT_WEBHOOK_SECRETS",
    "max_history_bytes": "DORMANT_MAX_HISTORY_BYTES",
    "history_cache_mib": "DORMANT_HISTORY_CACHE_MIB",
    "max_inbox_depth": "DORMANT_MAX_INBOX_DEPTH",
    "slice_deadline_s": "DORMANT_SLICE_DEADLINE_S",
    "quarantine_after_failures": "DORMANT_QUARANTINE_AFTER_FAILURES",
    "prune_older_than_s": "DORMANT_PRUNE_OLDER_THAN_S",
    "prune_batch_size": "DORMANT_PRUNE_BATCH_SIZE",
    "prune_interval_s": "DORMANT_PRUNE_INTERVAL_S",
    "rate_limits": "DORMANT_RATE_LIMITS",
    "ui_token": "DORMANT_UI_TOKEN",
    "ui_actions": "DORMANT_UI_ACTIONS",
    "tracing": "DORMANT_TRACING",
    "trace_new_after_s": "DORMANT_TRACE_NEW_AFTER_S",
    "trace_content": "DORMANT_TRACE_CONTENT",
    "trace_url_template": "DORMANT_TRACE_URL_TEMPLATE",
}


@dataclass(frozen=True)
class Settings:
    """How one dormant deployment is wired and tuned.

    ``secret_keys`` signs callback URLs: the first key signs, every key verifies, so a key
    can be rotated by prepending a new one.
    """

    database_url: str = "sqlite:///dormant.db"
    broker_url: str = "redis://127.0.0.1:6379/0"
    redis_url: str = "redis://127.0.0.1:6379/0"
    secret_keys: tuple[str, ...] = ()
    callback_base_url: str = "http://127.0.0.1:8765/dormant/callbacks"
    key_prefix: str = "dormant"
    agents_module: str = ""
    lease_ttl_s: float = 30.0
    """A slice's lease on its thread, renewed by its process every third of this while the
    slice runs (``runtime/lease_keeper.py``), however long its model takes: a dead worker's
    threads are re-driven this long after it died."""
    token_ttl_s: float = 7 * 24 * 3600.0
    max_message_bytes: int = 256 * 1024
    """One message's text (``launch``, ``send``, ``deliver``, events, callbacks): larger
    ones are refused with ``PayloadTooLarge`` before anything is stored."""
    max_history_bytes: int = 16 * 1024 * 1024
    """A thread's model-visible history (JSON bytes, after compaction): a slice that would
    send more to the model fails with ``HistoryTooLarge`` (recorded; 0 turns it off)."""
    history_cache_mib: float = 8.0
    """MiB of history items (their JSON bytes) an SQL store keeps decoded in the process,
    least recently used thread out first, so a busy thread's slice reads only the items
    committed since its last one (``stores/sql/items.py``). A worker's memory for it grows
    up to about twice this (the items' objects beside their JSON); 0 turns it off. Size it
    to the threads a worker serves in turn: a cache smaller than them is read through (LRU)
    and buys little. The default, from ``bench/history_cache.py``'s curve
    (docs/benchmarks.md), holds about 140 threads of 20 turns."""
    max_inbox_depth: int = 1000
    """Messages waiting in one thread's inbox (pending or deferred): user text and events
    past it are refused with ``InboxFull``; tool results never are (0 turns it off)."""
    slice_deadline_s: float = 600.0
    """A slice still running after this long is abandoned before its next model round or
    its commit, and recorded as a failure (``SliceDeadlineExceeded``; 0 turns it off)."""
    quarantine_after_failures: int = 3
    """A thread whose slices failed this many times in a row, the last ones with one inbox
    row alone as input, sets that row aside (quarantine) and goes on. Only below
    ``stall_after_failures`` (otherwise the thread stalls first); 0 turns it off."""
    prune_older_than_s: float = 0.0
    """Retention for the beat task ``dormant.prune``: closed threads and finished rows older
    than this are deleted. 0 (the default) means the beat task never prunes."""
    prune_batch_size: int = 500
    """Rows (or closed thread trees) deleted per transaction when pruning."""
    prune_interval_s: float = 3600.0
    """How often beat runs ``dormant.prune`` when ``prune_older_than_s`` is set."""
    max_rounds_per_slice: int = 8
    """Model calls one slice makes while every call of a completion is answered at once
    (built-ins, invalid calls): then the slice commits and the next one goes on, so a long
    run of such rounds is bounded per slice and ends where the budget says."""
    chunk_flush_s: float = 0.05
    """Streamed text is published to observers at most this often (coalesced chunks): a
    human cannot tell, and a slice makes one publish instead of one per chunk."""
    steer_check_s: float = 0.2
    """How often a streaming completion of an ``interrupt``-steered agent looks for new text."""
    model_attempts: int = 4
    model_backoff_s: float = 0.5
    model_backoff_max_s: float = 30.0
    stall_after_failures: int = 5
    failure_backoff_s: float = 5.0
    """After a failed slice the thread waits this long before the next, doubling each time
    up to ``failure_backoff_max_s``: a provider outage of minutes stalls nothing."""
    failure_backoff_max_s: float = 300.0
    sweep_interval_s: float = 2.0
    outbox_grace_s: float = 10.0
    dedup_ttl_s: float = 24 * 3600.0
    crash_points: frozenset[str] = field(default_factory=frozenset)
    """Test-only: names of points in the slice where a worker dies on purpose."""
    visibility_timeout_s: float = 3600.0
    """Redis broker: an unacknowledged task is redelivered after this long, so it must
    exceed the longest slice or tool run (a dead worker's tasks come back after it). On any
    broker, a tool task not run this long (plus ``outbox_grace_s``) after its dispatch is
    presumed lost and re-dispatched by the sweeper (``tool_start_timeout_s`` shortens
    that for tool tasks, and a started run is tracked by its claim)."""
    tool_claim_ttl_s: float = 20.0
    """A running tool task renews its outbox row's claim in SQL every third of this; a
    claim not renewed this long means the run died (a killed worker), and the sweeper sends
    the row again: lost tool work never waits for the broker's visibility timeout. A dead
    run's claim lapses two to three thirds of this after its last renewal, so this plus a
    sweep and the run again must fit in the 30 s within which lost work comes back
    (``make chaos``); 30 s did not. A run whose database stays unreachable for longer than
    two thirds of this may lose its claim and run again once it is back (a tool runs at
    least once)."""
    tool_max_runs: int = 3
    """How many runs of one tool call may die (their worker killed, their claim lapsed)
    before the next run answers the call with an error instead of starting the tool again:
    a tool that kills its worker every time must not be re-run for ever."""
    tool_start_timeout_s: float = 20.0
    """A tool task sent this long ago that no worker has started was lost by the broker (a
    flushed or restarted Redis): the sweeper sends it again. Short, because a second copy
    is harmless: a run starts only by claiming its row in SQL (``tools/claims.py``), and
    the claim succeeds once, so a copy still queued behind a backlog, or the original
    delivered late, finds the row claimed or ran and does nothing. What it costs is that
    skipped copy (one ``UPDATE``), at most 100 rows a sweep; what it buys is lost tool work
    back about 20 s after it was sent, where 300 s (the earlier default) left the call's
    thread waiting five minutes for a blink of Redis."""
    announce_interval_s: float = 30.0
    """How often a worker (or a ``LocalSystem``) renews its card in the store's roster of
    workers: the agents, tools and versions it runs (``runtime/whereabouts.py``)."""
    name_gone_after_s: float = 900.0
    """How long an agent or tool that no live worker has may still come back (a rolling
    deploy, a worker restarting): until then a worker that lacks it leaves its work on the
    queue; after it the call is answered with an error, or the thread stalls, saying so."""
    hand_in_timeout_s: float = 120.0
    """How long a finished tool keeps retrying, with backoff, to hand its result in while
    the database or Redis is unreachable; past it the run fails and the sweeper re-runs it."""
    broker_key_prefix: str = ""
    """Redis broker: a prefix for every key Celery uses (kombu's ``global_keyprefix``), so
    several deployments (or test runs) can share one Redis database. Refused with another
    broker (RabbitMQ: give each deployment a virtual host)."""
    webhook_secrets: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """``dormant serve``'s webhook sources and their shared secrets, from
    ``DORMANT_WEBHOOK_SECRETS="github=key1,key2;other=key3"`` (every key verifies)."""

    rate_limits: tuple[tuple[str, RateLimit], ...] = ()
    """Admission limits by model name (``openai:gpt-4.1-mini``) or base URL, from
    ``DORMANT_RATE_LIMITS='{"openai:gpt-4.1-mini": {"rpm": 500, "tpm": 200000}}'``; they
    win over a model's own ``rate_limit`` (``runtime/admission.py``)."""

    table_prefix: str = ""
    """Prepended to every table dormant creates (``myapp_`` gives ``myapp_threads``...), so
    its tables cannot collide with an application's in a shared database; several
    deployments with different prefixes can share one database."""
    debug: bool = False
    """The ``dormant`` command shows tracebacks instead of one line per error."""
    ui_token: str = ""
    """The token that opens ``dormant serve``'s dashboard (``/dormant/ui/``). Without one the
    dashboard answers only on a loopback bind, to local peers not behind a proxy."""
    ui_actions: bool = False
    """The dashboard offers retry and close (behind its auth and CSRF); else read-only."""
    tracing: bool = True
    """Trace slices and tool runs with OpenTelemetry when the application configured an
    SDK's tracer provider (docs/tracing.md); without one nothing is imported or paid.
    False turns tracing off even then."""
    trace_new_after_s: float = 3600.0
    """A message whose sender's trace context is older than this when a slice applies it
    (it waited: held back, a stalled thread retried) starts a new trace, linked to the old
    one, instead of continuing it."""
    trace_content: bool = False
    """Put prompts and answers on the ``chat`` spans (``gen_ai.input.messages``,
    ``gen_ai.output.messages``): off by default, as they may hold personal data."""
    trace_url_template: str = ""
    """A trace viewer's URL with ``{trace_id}`` (and ``{span_id}``), e.g.
    ``https://grafana.example/explore?traceId={trace_id}``: the dashboard links each
    applied message to the trace of the slice that applied it; ``dormant show --traces``
    prints them."""

    def __post_init__(self) -> None:
        if not _TABLE_PREFIX.fullmatch(self.table_prefix):
            raise ConfigurationError(
                f"table prefix {self.table_prefix!r} is not valid: use up to 20 lowercase"
                " letters, digits and underscores, starting with a letter (e.g. 'myapp_')"
            )
        if self.lease_ttl_s <= 0 or self.sweep_interval_s <= 0:
            raise ConfigurationError("lease_ttl_s and sweep_interval_s must be positive")
        if self.tool_claim_ttl_s <= 0 or self.tool_start_timeout_s <= 0:
            raise ConfigurationError("tool_claim_ttl_s and tool_start_timeout_s must be positive")
        if self.announce_interval_s <= 0 or self.name_gone_after_s < 0:
            raise ConfigurationError(
                "announce_interval_s must be positive and name_gone_after_s not negative"
            )
        if self.tool_max_runs < 1:
            raise ConfigurationError("tool_max_runs must be at least 1")
        if self.history_cache_mib < 0:
            raise ConfigurationError("history_cache_mib must not be negative (0 turns it off)")
        if self.max_message_bytes < 1024:
            raise ConfigurationError("max_message_bytes must be at least 1024")
        _check_scheme("DORMANT_BROKER_URL", self.broker_url, BROKER_SCHEMES)
        _check_scheme("DORMANT_REDIS_URL", self.redis_url, REDIS_SCHEMES)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``DORMANT_*`` variables (``env`` defaults to ``os.environ``)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, var in ENV_NAMES.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            if name == "secret_keys":
                values[name] = tuple(k.strip() for k in raw.split(",") if k.strip())
            elif name in ("debug", "ui_actions", "tracing", "trace_content"):
                values[name] = _flag(var, raw)
            elif name == "webhook_secrets":
                values[name] = _webhook_secrets(var, raw)
            elif name == "rate_limits":
                values[name] = _rate_limits(var, raw)
            elif name == "crash_points":
                values[name] = frozenset(p.strip() for p in raw.split(",") if p.strip())
            elif isinstance(getattr(cls, name, None), float):
                values[name] = _number(var, raw, float)
            elif isinstance(getattr(cls, name, None), int):
                values[name] = _number(var, raw, int)
            else:
                values[name] = raw
        values.update(overrides)
        return cls(**values)

    @property
    def history_cache_bytes(self) -> int:
        """``history_cache_mib`` in bytes, as ``SQLStore`` takes it."""
        return int(self.history_cache_mib * 1024 * 1024)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def require_secret(self) -> Settings:
        """These settings, failing clearly when no callback signing key is configured."""
        if not self.secret_keys:
            raise ConfigurationError(
                "DORMANT_SECRET_KEY is not set (under Django or Flask: SECRET_KEY in the "
                "DORMANT settings): callback URLs cannot be signed or verified"
            )
        return self

    def with_ephemeral_secret(self) -> Settings:
        """These settings with a random signing key if none is set.

        Callback tokens then stop verifying when the process ends: right for an in-memory
        system, whose threads end with the process too.
        """
        return self if self.secret_keys else replace(self, secret_keys=(secrets.token_hex(32),))

    def with_local_secret(self, *, verify_only: bool = False) -> Settings:
        """These settings with a signing key that lives as long as the database.

        ``DORMANT_SECRET_KEY`` (``secret_keys``) wins. Otherwise a SQLite file gets a key
        generated once and kept beside it (``<database>.key``, mode 0600), so a callback URL
        minted before a restart still verifies after it. Other databases get a key for
        this process only (their callback URLs die with it): set ``DORMANT_SECRET_KEY``.
        ``verify_only`` (a process that verifies URLs another process minted: ``dormant
        serve``, ``dormant callbacks``): only the key kept beside a SQLite file that is
        there, else none, since a key of its own would verify nothing.
        """
        if self.secret_keys:
            return self
        path = _sqlite_file(self.database_url)
        if verify_only and (path is None or not path.is_file()):
            return self
        if path is None:
            return self.with_ephemeral_secret()
        return replace(self, secret_keys=(_key_beside(path),))


def _sqlite_file(database_url: str) -> Path | None:
    """The file of a SQLite URL, or None (another database, or SQLite in memory)."""
    scheme, sep, rest = database_url.partition(":///")
    if not sep or scheme.split("+")[0] != "sqlite":
        return None
    database = rest.split("?")[0]
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def _key_beside(database: Path) -> str:
    """The key in ``<database>.key``, created atomically (mode 0600) if missing."""
    path = database.with_name(database.name + ".key")
    with contextlib.suppress(FileNotFoundError):
        return _read_key(path)
    temporary = path.with_name(f"{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32) + "\n")
            out.flush()
            os.fsync(out.fileno())
        # link() refuses to replace: if another process won the race, its key stands.
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        temporary.unlink()
    return _read_key(path)


def _read_key(path: Path) -> str:
    key = path.read_text().strip()
    if not key:
        raise ConfigurationError(f"the callback signing key file {path} is empty")
    return key


BROKER_SCHEMES = (
    *("redis", "rediss", "redis+socket", "sentinel"),
    *("amqp", "amqps", "pyamqp", "librabbitmq"),
    "memory",
)
"""The Celery brokers dormant runs on: Redis and RabbitMQ (kombu's names for them), and
kombu's in-process ``memory://`` for tests. Anything else is refused when the settings are
built, not at the first send."""
REDIS_SCHEMES = ("redis", "rediss", "unix")


def _check_scheme(var: str, url: str, schemes: tuple[str, ...]) -> None:
    """Refuse ``url`` unless each of its ``;``-separated failover URLs has one of
    ``schemes``: a ``http://`` broker would otherwise be accepted and fail much later."""
    for part in url.split(";"):
        scheme, sep, _ = part.strip().partition("://")
        if not sep or scheme.lower() not in schemes:
            accepted = ", ".join(f"{s}://" for s in schemes)
            raise ConfigurationError(
                f"{var}={redact(part.strip())!r} is not a usable URL: use {accepted}"
            )


def redact(url: str) -> str:
    """``url`` without its password, for a message or a printout."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, _, credentials = head.partition("://")
    user, colon, _ = credentials.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{tail}"


_TABLE_PREFIX = re.compile(r"([a-z][a-z0-9_]{0,19})?")


def _flag(var: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{var}={raw!r} is not a flag: use 1 or 0")


def _number(var: str, raw: str, kind: type[float] | type[int]) -> float | int:
    try:
        return kind(raw)
    except ValueError:
        raise ConfigurationError(
            f"{var}={raw!r} is not a{'n integer' if kind is int else ' number'}"
        ) from None


def _webhook_secrets(var: str, raw: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    sources = []
    for entry in (e.strip() for e in raw.split(";") if e.strip()):
        name, eq, keys = entry.partition("=")
        parsed = tuple(k.strip() for k in keys.split(",") if k.strip())
        if not eq or not name.strip() or not parsed:
            raise ConfigurationError(f"{var}: {name.strip()!r} is not source=key[,key...]")
        sources.append((name.strip(), parsed))
    return tuple(sources)


def _rate_limits(var: str, raw: str) -> tuple[tuple[str, RateLimit], ...]:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ConfigurationError(f"{var} is not JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise ConfigurationError(f"{var} must be a JSON object keyed by model name or base URL")
    return tuple(
        (str(key), RateLimit.from_mapping(f"{var}[{key!r}]", value))
        for key, value in parsed.items()
    )
