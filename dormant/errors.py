"""Every error dormant raises, under one root.

    DormantError
    ├── ConfigurationError          bad settings, unknown agent, missing secret key
    │   ├── SchemaMissing           the database has no dormant tables: run `dormant db upgrade`
    │   └── SchemaMismatch          its schema is older (run `dormant db upgrade`) or newer
    ├── Unavailable                 a server dormant needs cannot be reached; nothing was done
    │   ├── DatabaseUnavailable
    │   ├── BrokerUnavailable       the Celery broker
    │   └── RedisUnavailable        leases, dedup, events
    ├── NotFound
    │   ├── UnknownThread
    │   ├── UnknownCall
    │   ├── UnknownMessage          ``retry`` of a message that is not quarantined
    │   └── UnknownAgent
    ├── MessageRejected             the sender's input was refused; nothing was stored
    │   ├── ThreadClosed
    │   ├── SubscriptionCancelled
    │   ├── InvalidToken            forged, altered or expired callback capability
    │   ├── PayloadTooLarge
    │   ├── MalformedMessage
    │   ├── ThreadBusy              user text while a slice runs ("reject" steering)
    │   ├── InboxFull               the thread already has ``max_inbox_depth`` open rows
    │   ├── CallAnswered            a second, different result for an answered call
    │   ├── DuplicateMessage        the message id was already received
    │   ├── InvalidForkPoint        a fork's ``at_seq`` is not a position in the thread's history
    │   └── DecisionRefused         an approval decision that cannot be taken
    │       ├── NotAwaitingApproval the call never asked for approval
    │       ├── AlreadyDecided      first decision wins: this call was decided
    │       ├── DigestMismatch      the decision names arguments that are not the stored ones
    │       ├── DecisionNotAllowed  the tool's policy does not offer that decision
    │       └── InvalidEdit         edited arguments that fail the tool's schema
    ├── InvalidStreamId             a stream ``after`` id that is not one (``dormant.streams``)
    ├── InvalidToolArguments        a call's arguments fail its tool's schema (the call's result)
    ├── ThreadsFailed               run_until_idle: threads stalled or retrying after failures
    ├── SliceFailed                 a slice failed or met a stalled thread (already recorded)
    ├── LimitExceeded               a slice outgrew a limit (recorded as its failure)
    │   ├── HistoryTooLarge         the history passed ``max_history_bytes``
    │   ├── SliceDeadlineExceeded   the slice ran past ``slice_deadline_s``
    │   └── BudgetExceeded          the thread's budget is spent (it stalls at once)
    ├── ModelError                  the provider failed
    │   ├── ModelRetryable          rate limit, 5xx, dropped or truncated stream
    │   └── ModelFatal              bad request, auth: retrying cannot help
    └── ControlSignal               not failures: control flow between layers
        ├── LeaseLost               another slice owns the thread now, or it was closed
        ├── SteeredAway             new user text cancels a running completion
        ├── Throttled               no model capacity now: the slice defers its thread
        └── CrashPoint              raised at an armed test crash point

Every message names the offending id, so a log line is enough to find the thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dormant.rate_limit import ProviderLimits
    from dormant.runtime.idle import IdleReport

__all__ = [
    "AlreadyDecided",
    "BrokerUnavailable",
    "BudgetExceeded",
    "CallAnswered",
    "ConfigurationError",
    "ControlSignal",
    "CrashPoint",
    "DatabaseUnavailable",
    "DecisionNotAllowed",
    "DecisionRefused",
    "DigestMismatch",
    "DormantError",
    "DuplicateMessage",
    "HistoryTooLarge",
    "InboxFull",
    "InvalidEdit",
    "InvalidForkPoint",
    "InvalidStreamId",
    "InvalidToken",
    "InvalidToolArguments",
    "LeaseLost",
    "LimitExceeded",
    "MalformedMessage",
    "MessageRejected",
    "ModelError",
    "ModelFatal",
    "ModelRetryable",
    "NotAwaitingApproval",
    "NotFound",
    "PayloadTooLarge",
    "RedisUnavailable",
    "SchemaMismatch",
    "SchemaMissing",
    "SliceDeadlineExceeded",
    "SliceFailed",
    "SteeredAway",
    "SubscriptionCancelled",
    "ThreadBusy",
    "ThreadClosed",
    "ThreadsFailed",
    "Throttled",
    "Unavailable",
    "UnknownAgent",
    "UnknownCall",
    "UnknownMessage",
    "UnknownThread",
]


class DormantError(Exception):
    """The root of every error dormant raises."""


class ConfigurationError(DormantError):
    pass


class SchemaMissing(ConfigurationError):
    """The database (or its file) exists without dormant's tables, or does not exist."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{detail}: create the schema with `dormant db upgrade`")


class SchemaMismatch(ConfigurationError):
    """The database's schema is not the one this dormant reads and writes: an older one
    (``dormant db upgrade`` brings it up, and nothing runs until then) or a newer one,
    migrated by a later release (processes of this one run on, as in a rolling upgrade,
    and say so; only ``dormant db upgrade`` and ``LocalSystem`` refuse it)."""

    def __init__(self, found: str, needed: str, *, ahead: bool) -> None:
        if ahead:
            message = (
                f"the schema is at {found}, newer than this dormant knows (it needs {needed}):"
                " a later release migrated this database; upgrade dormant to that release"
            )
        else:
            message = (
                f"the schema is at {found}, this dormant needs {needed}: run `dormant db upgrade`"
            )
        super().__init__(message)
        self.found = found
        self.needed = needed
        self.ahead = ahead


class Unavailable(DormantError):
    """A server dormant needs did not answer; ``detail`` says which address failed."""

    service = "a server"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.service} is unreachable: {detail}")
        self.detail = detail


class DatabaseUnavailable(Unavailable):
    service = "the database"


class BrokerUnavailable(Unavailable):
    service = "the Celery broker"


class RedisUnavailable(Unavailable):
    service = "Redis"


class NotFound(DormantError):
    pass


class UnknownThread(NotFound):
    """No such thread: it never existed, or retention deleted it (``dormant prune``). The
    two are not told apart on purpose: pruning keeps no tombstone (see docs/guarantees.md)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"unknown thread {thread_id!r} (never created, or pruned)")
        self.thread_id = thread_id


class UnknownCall(NotFound):
    def __init__(self, thread_id: str, call_id: str) -> None:
        super().__init__(f"thread {thread_id!r} never made call {call_id!r}")
        self.thread_id = thread_id
        self.call_id = call_id


class UnknownMessage(NotFound):
    def __init__(self, thread_id: str, message_id: str) -> None:
        super().__init__(f"thread {thread_id!r} has no quarantined message {message_id!r}")
        self.thread_id = thread_id
        self.message_id = message_id


class UnknownAgent(NotFound, ConfigurationError):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(
            f"unknown agent {name!r}; registered: {', '.join(sorted(known)) or 'none'}"
        )
        self.name = name


class MessageRejected(DormantError):
    """Input refused before it reached the history; ``reason`` is what the sender sees."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ThreadClosed(MessageRejected):
    def __init__(self, thread_id: str, closed_reason: str = "") -> None:
        why = f" ({closed_reason})" if closed_reason else ""
        super().__init__(f"thread {thread_id!r} is closed{why}")
        self.thread_id = thread_id
        self.closed_reason = closed_reason


class SubscriptionCancelled(MessageRejected):
    def __init__(self, thread_id: str, call_id: str) -> None:
        super().__init__(f"subscription {call_id!r} of thread {thread_id!r} was cancelled")
        self.thread_id = thread_id
        self.call_id = call_id


class InvalidToken(MessageRejected):
    pass


class InvalidToolArguments(DormantError):
    """A call's arguments fail its tool's schema when the tool runs: a call stored before a
    deploy changed the signature, with no ``upgrade_args`` that maps it. The message is
    the same readable one a new call with bad arguments gets."""


class InvalidStreamId(DormantError):
    """A stream's ``after`` (or ``Last-Event-ID``) that no stream ever gave out."""

    def __init__(self, event_id: str) -> None:
        super().__init__(f"not a stream event id: {event_id[:40]!r}")


class PayloadTooLarge(MessageRejected):
    pass


class MalformedMessage(MessageRejected):
    pass


class ThreadBusy(MessageRejected):
    """User text refused while a slice runs (an agent with ``steering="reject"``)."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(
            f"thread {thread_id!r} is busy and its agent refuses text until it is done"
        )
        self.thread_id = thread_id


class InboxFull(MessageRejected):
    """The thread already has ``max_inbox_depth`` messages waiting (pending or deferred):
    the sender should slow down and try again once the thread has caught up."""

    def __init__(self, thread_id: str, depth: int) -> None:
        super().__init__(
            f"thread {thread_id!r} already has {depth} messages waiting (max_inbox_depth); "
            "try again once it has caught up"
        )
        self.thread_id = thread_id
        self.depth = depth


class CallAnswered(MessageRejected):
    """A result with a new message id for a call that already has its result (and is not
    a subscription, whose later results are events): it would change nothing."""

    def __init__(self, thread_id: str, call_id: str, message_id: str) -> None:
        super().__init__(
            f"message {message_id!r} refused: call {call_id!r} of thread {thread_id!r} "
            "already has its result (only a subscription takes more than one)"
        )
        self.thread_id = thread_id
        self.call_id = call_id
        self.message_id = message_id


class DuplicateMessage(MessageRejected):
    def __init__(self, thread_id: str, message_id: str) -> None:
        super().__init__(f"message {message_id!r} was already received by thread {thread_id!r}")
        self.thread_id = thread_id
        self.message_id = message_id


class DecisionRefused(MessageRejected):
    """An approval decision refused before it reached the inbox (``docs/approvals.md``)."""

    def __init__(self, thread_id: str, call_id: str, why: str) -> None:
        super().__init__(f"decision on call {call_id!r} of thread {thread_id!r} refused: {why}")
        self.thread_id = thread_id
        self.call_id = call_id


class NotAwaitingApproval(DecisionRefused):
    def __init__(self, thread_id: str, call_id: str) -> None:
        super().__init__(thread_id, call_id, "the call does not await approval")


class AlreadyDecided(DecisionRefused):
    """First decision wins; ``decided`` says what it was, when known."""

    def __init__(self, thread_id: str, call_id: str, decided: str = "") -> None:
        why = f"already decided ({decided})" if decided else "already decided"
        super().__init__(thread_id, call_id, why)
        self.decided = decided


class DigestMismatch(DecisionRefused):
    def __init__(self, thread_id: str, call_id: str, given: str, stored: str) -> None:
        super().__init__(
            thread_id,
            call_id,
            f"digest {given!r} does not match the stored arguments' {stored!r}",
        )


class DecisionNotAllowed(DecisionRefused):
    def __init__(self, thread_id: str, call_id: str, decision: str, allowed: tuple[str, ...]):
        super().__init__(
            thread_id, call_id, f"{decision!r} is not allowed here (allowed: {', '.join(allowed)})"
        )


class InvalidEdit(DecisionRefused):
    """Edited arguments that fail the tool's schema; the reason says which field."""


class InvalidForkPoint(MessageRejected):
    """``fork`` at a seq the thread's history does not reach, ``replay`` from one that is
    not user text (nothing made)."""

    def __init__(self, thread_id: str, at_seq: int, why: str) -> None:
        super().__init__(f"thread {thread_id!r}: cannot start at seq {at_seq}: {why}")
        self.thread_id = thread_id
        self.at_seq = at_seq


class ThreadsFailed(DormantError):
    """``run_until_idle`` found threads that failed instead of finishing: each stalled or
    waiting to retry, with its last error. ``report`` lists them (``IdleReport``)."""

    def __init__(self, report: IdleReport) -> None:
        super().__init__(report.describe())
        self.report = report
        self.thread_ids = [failure.thread_id for failure in report.failed]


class SliceFailed(DormantError):
    """Raised by the Celery slice task after the failure is recorded in the store, so the
    task ends as a FAILURE (Flower counts it, with this message) and its message is acked:
    the inbox rows stay in SQL and the retry is the store's backoff or ``dormant retry``."""

    def __init__(self, thread_id: str, reason: str, *, stalled: bool) -> None:
        # The reason first: Flower's exception column shows the start of the message.
        super().__init__(f"{'stalled' if stalled else 'failed'}: {reason} (thread {thread_id!r})")
        self.thread_id = thread_id
        self.reason = reason
        self.stalled = stalled

    def __reduce__(self) -> tuple[object, ...]:
        # Celery round-trips a task's exception through pickle before reporting it and
        # reports the nearest base class that survives; this keeps SliceFailed itself.
        return (_slice_failed, (self.thread_id, self.reason, self.stalled))


def _slice_failed(thread_id: str, reason: str, stalled: bool) -> SliceFailed:
    return SliceFailed(thread_id, reason, stalled=stalled)


class LimitExceeded(DormantError):
    """A slice outgrew a configured limit; like any slice exception it is recorded as the
    slice's failure (and counts towards quarantine and stalling)."""


class HistoryTooLarge(LimitExceeded):
    def __init__(self, thread_id: str, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"history of thread {thread_id!r} is {size_bytes} bytes; the limit is "
            f"{limit_bytes} (max_history_bytes)"
        )
        self.thread_id = thread_id


class SliceDeadlineExceeded(LimitExceeded):
    def __init__(self, thread_id: str, elapsed_s: float, deadline_s: float) -> None:
        super().__init__(
            f"slice of thread {thread_id!r} ran {elapsed_s:.1f} s, past its deadline of "
            f"{deadline_s:g} s (slice_deadline_s); nothing was committed"
        )
        self.thread_id = thread_id


class BudgetExceeded(LimitExceeded):
    """A model call would pass the thread's budget: the slice consumes nothing (it keeps
    only a compaction summary it paid for) and the thread stalls at once, its
    ``last_error`` this message (``budget: <limit> used/limit``) until ``raise_budget``
    or ``retry``."""

    def __init__(self, thread_id: str, limit: str, used: float, allowed: float) -> None:
        super().__init__(f"budget: {limit} {_amount(used)}/{_amount(allowed)} (thread {thread_id})")
        self.thread_id = thread_id
        self.limit = limit


def _amount(value: float) -> str:
    """Tokens and counts as integers, costs with up to 6 decimals."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6f}".rstrip("0")


class ModelError(DormantError):
    pass


class ModelRetryable(ModelError):
    """A failure worth retrying; ``retry_after_s`` is the provider's hint, if it gave one;
    ``status`` its HTTP status (429: a rate limit) and ``limits`` its rate-limit headers."""

    def __init__(
        self,
        message: str,
        retry_after_s: float | None = None,
        *,
        status: int | None = None,
        limits: ProviderLimits | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.status = status
        self.limits = limits


class ModelFatal(ModelError):
    """Retrying cannot help; ``status`` is the provider's HTTP status when it sent one
    (400 blames the request, 401 the deployment's key: quarantine tells them apart)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ControlSignal(DormantError):
    pass


class LeaseLost(ControlSignal):
    """The slice's lease was taken or revoked; ``closed_reason`` is set (possibly "") when
    the thread was closed meanwhile, which revokes it."""

    def __init__(self, thread_id: str, closed_reason: str | None = None) -> None:
        if closed_reason is None:
            message = f"lease on thread {thread_id!r} was lost to another slice"
        else:
            why = f" ({closed_reason})" if closed_reason else ""
            message = f"thread {thread_id!r} was closed{why}: the slice stopped, nothing written"
        super().__init__(message)
        self.thread_id = thread_id
        self.closed_reason = closed_reason


class SteeredAway(ControlSignal):
    def __init__(self, thread_id: str) -> None:
        super().__init__(f"new user text for thread {thread_id!r} cancels the running completion")
        self.thread_id = thread_id


class Throttled(ControlSignal):
    """Admission refused a model call (or the provider answered 429): the slice ends
    without consuming anything and its thread is woken after ``wait_s``."""

    def __init__(self, thread_id: str, bucket: str, wait_s: float) -> None:
        super().__init__(
            f"thread {thread_id!r} waits {wait_s:.2f} s for model capacity in {bucket!r}"
        )
        self.thread_id = thread_id
        self.bucket = bucket
        self.wait_s = wait_s


class CrashPoint(ControlSignal):
    """Raised at an armed crash point (tests only); Celery workers turn it into SIGKILL."""

    def __init__(self, name: str) -> None:
        super().__init__(f"crash point {name!r} reached")
        self.name = name
