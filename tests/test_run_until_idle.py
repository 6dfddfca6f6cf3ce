"""``run_until_idle`` tells "done" from "stuck": a failed thread is named with its reason."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dormant import Agent, LocalSystem
from dormant.errors import ModelFatal, ThreadsFailed
from dormant.messages import Item, UserText
from dormant.models import ScriptedModel, reply
from dormant.models.base import Completion
from dormant.settings import Settings
from dormant.stores.base import ThreadStatus


def missing_credentials(items: Sequence[Item]) -> Completion:
    raise ModelFatal("Missing credentials. Please pass an `api_key`, or set OPENAI_API_KEY.")


def fails_on_request(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText) and last.text == "fail":
        return missing_credentials(items)
    return reply("fine")


FAILING = Agent("triage", model=ScriptedModel(missing_credentials))
SOMETIMES = Agent("sometimes", model=ScriptedModel(fails_on_request))


def test_run_until_idle_names_a_thread_whose_model_failed_and_why() -> None:
    with LocalSystem([FAILING], "memory://") as system:
        thread_id = system.launch("triage", "Is main green?")
        with pytest.raises(ThreadsFailed) as raised:
            system.run_until_idle()
    assert raised.value.thread_ids == [thread_id]
    message = str(raised.value)
    assert thread_id in message and "Missing credentials" in message
    assert "stalled after 1 failed slice(s); `retry` re-drives it" in message


def test_run_until_idle_can_return_the_failures_as_a_report_instead() -> None:
    settings = Settings(stall_after_failures=1)
    with LocalSystem([SOMETIMES], "memory://", settings=settings) as system:
        failing = system.launch("sometimes", "fail")
        system.launch("sometimes", "hello")
        report = system.run_until_idle(raise_on_failure=False)
    [failure] = report.failed
    assert (failure.thread_id, failure.status, failure.failures) == (
        failing,
        ThreadStatus.STALLED,
        1,
    )
    assert failure.error.startswith("ModelFatal: Missing credentials")
    assert "stalled after 1 failed slice(s); `retry` re-drives it" in report.describe()


def test_run_until_idle_reports_nothing_when_every_thread_finished() -> None:
    with LocalSystem([SOMETIMES], "memory://") as system:
        system.launch("sometimes", "hello")
        report = system.run_until_idle()
    assert report.ok and report.failed == ()
