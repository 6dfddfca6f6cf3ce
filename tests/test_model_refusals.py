"""A provider refusing the deployment (a bad or missing key) stalls its thread at once,
with its reason; a provider refusing one request blames that message instead."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dormant import Agent, LocalSystem
from dormant.errors import ModelFatal
from dormant.messages import Item
from dormant.models import ScriptedModel
from dormant.models.base import Completion
from dormant.settings import Settings
from dormant.stores.base import ThreadStatus


class Refusing:
    """A model whose provider refuses every request with ``status``, counting the tries."""

    def __init__(self, status: int | None, reason: str) -> None:
        self.status = status
        self.reason = reason
        self.calls = 0

    def __call__(self, items: Sequence[Item]) -> Completion:
        self.calls += 1
        raise ModelFatal(self.reason, status=self.status)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (401, "HTTP 401: invalid x-api-key"),
        (None, "cannot create the OpenAI client: Missing credentials (OPENAI_API_KEY)"),
        (404, "HTTP 404: model 'gpt-9' does not exist"),
    ],
)
def test_a_provider_refusing_the_deployment_stalls_the_thread_at_once_with_its_reason(
    status: int | None, reason: str
) -> None:
    model = Refusing(status, reason)
    settings = Settings(stall_after_failures=5, failure_backoff_s=0.0)
    with LocalSystem([Agent("a", model=ScriptedModel(model))], "memory://", settings=settings) as s:
        thread_id = s.launch("a", "hello")
        report = s.run_until_idle(raise_on_failure=False)
        thread = s.thread(thread_id)
    assert model.calls == 1
    assert (thread.status, thread.failures) == (ThreadStatus.STALLED, 1)
    assert thread.last_error == f"ModelFatal: {reason}"
    [failure] = report.failed
    assert failure.status is ThreadStatus.STALLED and failure.error == thread.last_error


def test_a_provider_refusing_one_request_is_retried_towards_quarantine_not_stalled() -> None:
    model = Refusing(400, "HTTP 400: messages: roles must alternate")
    settings = Settings(stall_after_failures=5, failure_backoff_s=0.0)
    with LocalSystem([Agent("a", model=ScriptedModel(model))], "memory://", settings=settings) as s:
        thread_id = s.launch("a", "hello")
        report = s.run_until_idle(raise_on_failure=False)
        thread = s.thread(thread_id)
        quarantined = s.store.quarantined()
    assert model.calls == settings.quarantine_after_failures  # blamed on the message ...
    assert [row.message_id for row in quarantined] == [f"launch:{thread_id}"]
    assert thread.status is not ThreadStatus.STALLED  # ... and the thread goes on
    assert report.failed
