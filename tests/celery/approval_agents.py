"""The agent of the Celery approval test (``DORMANT_AGENTS=approval_agents``): it asks to
pay (held for a person's approval) and to look the account up (runs at once); each run of
``pay`` is recorded in Redis under the run's prefix, so the test counts them."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import celery_agents  # noqa: F401  (its worker_ready handler tells the test a worker is up)
from celery_agents import shared_key, worker_redis

from dormant import Agent, Approval, tool
from dormant.messages import Item, ToolResult, UserText
from dormant.models import Completion, ScriptedModel, call, reply

__all__ = ["AGENTS", "payer"]

WEEK_S = 7 * 86_400.0


@tool(approval=Approval(timeout_s=WEEK_S, prompt="Pay {amount} to {account}?"))
def pay(account: str, amount: float) -> str:
    """Pay an account."""
    key = shared_key(os.environ["DORMANT_KEY_PREFIX"], "paid")
    worker_redis().rpush(key, json.dumps({"account": account, "amount": amount}))
    return f"paid {amount} to {account}"


@tool
def balance(account: str) -> str:
    """An account's balance."""
    return f"{account}: 1000"


def _payer(history: Sequence[Item]) -> Completion:
    last = history[-1]
    if isinstance(last, UserText):
        return reply(
            "",
            call("pay", "c_pay", account="acme", amount=250.0),
            call("balance", "c_balance", account="acme"),
        )
    results = [i for i in history if isinstance(i, ToolResult)]
    return reply(f"done after {len(results)} results")


payer = Agent("payer", model=ScriptedModel(_payer), tools=[pay, balance])
AGENTS = [payer]
