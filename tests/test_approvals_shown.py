"""What a person deciding a held call is told: the prompt, with the tool's defaults for
arguments the model left out, and why a decision is refused once the thread was closed."""

from __future__ import annotations

import pytest

from dormant import Agent, Approval, tool
from dormant.errors import AlreadyDecided
from dormant.models import call, reply
from dormant.stores.base import Store
from tests.harness import Harness, results
from tests.test_approvals import RAN, _harness, _refund_and_lookup, _script


@pytest.fixture(autouse=True)
def _clear_runs() -> None:
    RAN.clear()


def test_a_decision_on_a_closed_threads_call_names_the_close(store: Store) -> None:
    """Closing the thread answers its held call; a decision after it was refused with
    "already decided (the call is answered)", though nobody decided: it now says the
    thread was closed first, and why."""
    h, _ = _harness(store, _refund_and_lookup())
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    h.close_thread(t, reason="the customer left")
    with pytest.raises(AlreadyDecided) as refused:
        h.approve(t, "c_refund", by="alice")
    assert "the thread was closed first: the customer left" in str(refused.value)
    assert [r.call_id for r in results(h.history(t)) if r.call_id == "c_refund"] == ["c_refund"]
    assert not any(name == "refund" for name, _ in RAN)


@tool(approval=Approval(prompt="Refund {amount} {currency} on {order_id}?"))
def refund_in(order_id: str, amount: float, currency: str = "EUR") -> str:
    """Refund an order, in a currency (euros unless the model says)."""
    RAN.append(("refund_in", {"order_id": order_id, "amount": amount, "currency": currency}))
    return "ok"


def test_a_prompt_naming_an_argument_the_model_left_to_its_default_shows_the_default(
    store: Store,
) -> None:
    """The prompt is formatted with the call's arguments; one naming an argument the model
    left out (its default applies) was shown raw, ``Refund {amount} {currency} on
    {order_id}?``, to the person deciding. The tool's defaults now fill it in; the stored
    arguments (and their digest) stay the model's."""
    model = _script(reply("", call("refund_in", "c_in", order_id="o1", amount=250.0)))
    h = Harness(Agent("clerk", model=model, tools=[refund_in]), store=store)
    t = h.launch("clerk", "refund o1")
    h.settle(t)
    [held] = h.pending_approvals()
    assert held.prompt == "Refund 250.0 EUR on o1?"
    assert held.args == {"order_id": "o1", "amount": 250.0}
