"""The support agent: a scripted model (no provider needed) and a tool reading the Order table.

Swap ``ScriptedModel(_script)`` for ``OpenAIModel("gpt-4.1-mini")`` to use a real model.
"""

from collections.abc import Sequence

from dormant import Agent, tool
from dormant.messages import Item, ToolResult, UserText
from dormant.models import Completion, ScriptedModel, SimulatedModel, call, reply
from shop.models import Order


@tool
def order_status(order_id: int) -> str:
    """The item and status of an order, read from the shop's database."""
    order = Order.objects.get(id=order_id)
    return f"order {order.id} ({order.item}) is {order.status}"


def _script(history: Sequence[Item]) -> Completion:
    last = history[-1]
    if isinstance(last, ToolResult):
        return reply(f"Thanks for waiting: {last.content}.")
    asked = [item.text for item in history if isinstance(item, UserText)][-1]
    order_id = int(asked.rsplit("#", 1)[1])
    return reply("Let me look that up.", call("order_status", order_id=order_id))


support = Agent("support", model=ScriptedModel(_script), tools=[order_status])
# The chat page's agent: a simulated model that writes a few hundred characters slowly, so
# the page shows the answer streaming (swap in OpenAIModel("gpt-4.1-mini") for a real one).
chat = Agent("chat", model=SimulatedModel(completion_chars=480, chunk_chars=6, chunk_delay_s=0.08))
AGENTS = [support, chat]
