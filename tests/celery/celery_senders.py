"""Client processes for the ordering test (a module, so ``spawn`` children can import it)."""

from __future__ import annotations

from dormant.client import Client


def send_messages(env: dict[str, str], sender: int, thread_ids: list[str], per_thread: int) -> int:
    """Send ``per_thread`` messages ``s{sender}-{i}`` to every thread, in order of ``i``."""
    sent = 0
    with Client.from_env(env) as client:
        for i in range(per_thread):
            for thread_id in thread_ids:
                client.send(thread_id, f"s{sender}-{i}", message_id=f"s{sender}-{i}")
                sent += 1
    return sent
