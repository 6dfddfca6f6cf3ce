"""A parent with two children and one threaded event, on SQLite; then inspect it.

python examples/family.py /tmp/family.db
dormant threads --database-url sqlite:////tmp/family.db
dormant show thr_family --database-url sqlite:////tmp/family.db
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dormant import Agent, LocalSystem, tool
from dormant.messages import EventShown, Item, ToolResult, UserText
from dormant.models import ScriptedModel, call, reply
from dormant.models.base import Completion


@tool(subscription=True)
def watch_incidents(service: str) -> str:
    """Subscribe to incidents of a service."""
    return f"Watching {service} for incidents."


def script(items: Sequence[Item]) -> Completion:
    last = items[-1]
    if isinstance(last, UserText):
        return reply(
            "I'll split the release check and keep an eye on incidents.",
            call("spawn_thread", instructions="check the changelog"),
            call("spawn_thread", instructions="check the migrations"),
            call("watch_incidents", service="billing"),
        )
    if isinstance(last, ToolResult) and last.content.startswith("You are now inside"):
        task = last.content.split("Your task: ")[1].split("\n")[0]
        return reply(f"Done: {task}.", call("close_thread", report=f"{task}: all good"))
    if isinstance(last, EventShown) and last.original_name == "watch_incidents":
        if "Report" in last.content:
            return reply(f"Noted the incident report: {last.content}")
        # Inside the temporary thread for the event: worth telling the parent.
        return reply("", call("report_to_parent", report=f"{last.content}; no release impact"))
    if isinstance(last, ToolResult) and last.name == "report_to_parent":
        return reply("", call("close_thread"))
    if isinstance(last, EventShown):
        return reply(f"Noted: {last.content}")
    return reply("Waiting for my children and for incidents.")


AGENT = Agent("release", model=ScriptedModel(script), tools=[watch_incidents], threads=True)


def main(path: str) -> None:
    with LocalSystem([AGENT], f"sqlite:///{path}") as system:
        system.launch("release", "Is release 1.4 ready to ship?", thread_id="thr_family")
        system.run_until_idle()
        watch = next(
            c.call_id
            for c in system.store.load("thr_family").calls.values()
            if c.name == "watch_incidents"
        )
        system.send_event("thr_family", watch, "INC-7: billing latency up 20%", message_id="inc-7")
        system.run_until_idle()
    print(f"wrote {path}: try `dormant threads --database-url sqlite:///{path}`")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "family.db")
